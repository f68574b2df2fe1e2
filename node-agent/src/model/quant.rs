//! Element conversions of the KV store: bf16 and fp8 e4m3 (the "fn" variant: no infinities, one NaN).

/// f32 to bf16 bits, rounding to nearest even (NaN stays NaN).
pub(crate) fn f32_to_bf16(value: f32) -> u16 {
    half::bf16::from_f32(value).to_bits()
}

/// bf16 bits to f32 (exact).
#[inline]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Largest finite e4m3fn value.
pub(crate) const E4M3_MAX: f32 = 448.0;

/// f32 to e4m3fn bits, rounding to nearest even; magnitudes past 448 saturate to ±448, NaN stays NaN.
pub(crate) fn f32_to_e4m3(value: f32) -> u8 {
    let sign: u8 = if value.is_sign_negative() { 0x80 } else { 0 };
    let magnitude = value.abs();
    if magnitude.is_nan() {
        return sign | 0x7f;
    }
    // Below the smallest normal (2^-6) values are multiples of 2^-9; scaling by 2^9 is exact, and code
    // 8 (the rounding of 7.5..8) is exactly the smallest normal.
    if magnitude < 0.015_625 {
        return sign | (magnitude * 512.0).round_ties_even() as u8;
    }
    if magnitude >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Round the f32 mantissa to 3 bits, to nearest even; a carry moves into the exponent on its own.
    let bits = magnitude.to_bits();
    let rounded = bits + 0x7_ffff + ((bits >> 20) & 1);
    let exponent = (rounded >> 23) as i32 - 127 + 7;
    let code = ((exponent as u32) << 3) | ((rounded >> 20) & 7);
    sign | code.min(0x7e) as u8
}

/// Every e4m3fn code as f32.
pub(crate) static E4M3_TO_F32: [f32; 256] = e4m3_table();

const fn e4m3_table() -> [f32; 256] {
    let mut table = [0.0f32; 256];
    let mut code = 0;
    while code < 256 {
        let exponent = (code >> 3) & 0xf;
        let mantissa = (code & 7) as u32;
        let magnitude = if exponent == 0xf && mantissa == 7 {
            f32::NAN
        } else if exponent == 0 {
            // mantissa * 2^-9, built from bits: exact.
            mantissa as f32 / 512.0
        } else {
            f32::from_bits(((exponent as u32 + 127 - 7) << 23) | (mantissa << 20))
        };
        table[code] = if code & 0x80 != 0 { -magnitude } else { magnitude };
        code += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even mantissa (1.0).
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(bf16_to_f32(f32_to_bf16(-2.5)), -2.5);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn e4m3_table_landmarks() {
        assert_eq!(E4M3_TO_F32[0x00], 0.0);
        assert_eq!(E4M3_TO_F32[0x01], 2f32.powi(-9));
        assert_eq!(E4M3_TO_F32[0x08], 2f32.powi(-6));
        assert_eq!(E4M3_TO_F32[0x38], 1.0);
        assert_eq!(E4M3_TO_F32[0x7e], 448.0);
        assert!(E4M3_TO_F32[0x7f].is_nan());
        assert_eq!(E4M3_TO_F32[0xb8], -1.0);
    }

    #[test]
    fn e4m3_round_trips_every_finite_code() {
        for code in 0..=255u8 {
            let value = E4M3_TO_F32[usize::from(code)];
            if value.is_nan() {
                assert!(E4M3_TO_F32[usize::from(f32_to_e4m3(value))].is_nan());
                continue;
            }
            let back = f32_to_e4m3(value);
            // +0 and -0 are distinct codes and both round-trip.
            assert_eq!(back, code, "code {code:#04x} value {value}");
        }
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        // Between 1.0 (0x38) and 1.125 (0x39): the midpoint ties to the even code 0x38.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.07), 0x39);
        // Between 1.125 (0x39) and 1.25 (0x3a): ties to 0x3a.
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        // Mantissa carry into the exponent: just below 2, rounds to 2.0 (0x40).
        assert_eq!(f32_to_e4m3(1.99), 0x40);
        // Subnormals: 2.5 * 2^-9 ties to 2 * 2^-9.
        assert_eq!(f32_to_e4m3(2.5 * 2f32.powi(-9)), 0x02);
        assert_eq!(f32_to_e4m3(7.5 * 2f32.powi(-9)), 0x08);
        assert_eq!(f32_to_e4m3(1e6), 0x7e);
        assert_eq!(f32_to_e4m3(-1e6), 0xfe);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7e);
        // Just under 448 rounds to 448; values between 448 and 480 saturate.
        assert_eq!(f32_to_e4m3(440.0), 0x7e);
        assert_eq!(f32_to_e4m3(470.0), 0x7e);
    }

    #[test]
    fn e4m3_is_monotonic_and_nearest() {
        // Exhaustive over a dense sample: the decoded value is the nearest code.
        let finite: Vec<f32> = (0..0x7f).map(|code| E4M3_TO_F32[code]).collect();
        let mut x = 0.0f32;
        while x < 460.0 {
            let decoded = E4M3_TO_F32[usize::from(f32_to_e4m3(x))];
            let best = finite.iter().map(|v| (v - x).abs()).fold(f32::INFINITY, f32::min);
            assert!(((decoded - x).abs() - best).abs() <= f32::EPSILON * x, "x {x} decoded {decoded}");
            x = x * 1.013 + 1e-4;
        }
    }
}
