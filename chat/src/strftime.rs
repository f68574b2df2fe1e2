//! `strftime_now` for chat templates: the current UTC time in a subset of C's `strftime` directives.

use minijinja::ErrorKind;

/// `strftime_now(format)`: the current UTC time, for templates that put
/// today's date into the system prompt (such prompts change once a day).
pub(crate) fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs() as i64);
    format_time(&format, seconds)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

fn format_time(format: &str, unix_seconds: i64) -> Result<String, minijinja::Error> {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{}", other.map(String::from).unwrap_or_default()),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_formatting() {
        // 2024-02-29T13:05:09Z, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(format_time("%Y-%m-%d %H:%M:%S", t).unwrap(), "2024-02-29 13:05:09");
        assert_eq!(format_time("%d %b %Y, %A %B %a %y %%", t).unwrap(), "29 Feb 2024, Thursday February Thu 24 %");
        assert_eq!(format_time("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert!(format_time("%Q", t).is_err());
    }
}
