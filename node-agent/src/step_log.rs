//! `--step-log FILE`: each engine step's [`StepCost`] as one JSON line, the records
//! `bench/fit-step-profile.py` fits a simulator cost profile of this machine to.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use crate::engine::StepCost;

/// An append-only file of step records, one JSON object per line.
#[derive(Debug)]
pub struct StepLog {
    file: Mutex<File>,
}

impl StepLog {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> std::io::Result<StepLog> {
        Ok(StepLog { file: Mutex::new(File::create(path)?) })
    }

    /// Appends one record with a single write, so a reader never sees half a line of a finished step.
    /// A failed write is logged once per failure and otherwise ignored: the log is a measurement aid.
    pub fn record(&self, cost: &StepCost) {
        let line = line_of(cost);
        let mut file = self.file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(error) = file.write_all(line.as_bytes()) {
            tracing::warn!(%error, "writing the step log");
        }
    }
}

/// One record: `{"tokens":..,"sampled":..,"attended":..,"forward_seconds":..,"step_seconds":..}` and a newline.
fn line_of(cost: &StepCost) -> String {
    let StepCost { tokens, sampled, attended, forward_seconds, step_seconds } = cost;
    format!(
        "{{\"tokens\":{tokens},\"sampled\":{sampled},\"attended\":{attended},\"forward_seconds\":{forward_seconds},\"step_seconds\":{step_seconds}}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_is_one_json_line_with_every_field() {
        let path = std::env::temp_dir().join(format!("kvroute-step-log-{}.jsonl", std::process::id()));
        let log = StepLog::create(&path).unwrap();
        let first = StepCost { tokens: 48, sampled: 3, attended: 1176.5, forward_seconds: 0.0125, step_seconds: 0.013 };
        let second = StepCost { tokens: 1, sampled: 1, attended: 2e-7, forward_seconds: 1e-9, step_seconds: 0.0 };
        log.record(&first);
        log.record(&second);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let records: Vec<serde_json::Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        assert_eq!(records.len(), 2);
        for (record, cost) in records.iter().zip([first, second]) {
            assert_eq!(record["tokens"], cost.tokens);
            assert_eq!(record["sampled"], cost.sampled);
            assert_eq!(record["attended"].as_f64(), Some(cost.attended));
            assert_eq!(record["forward_seconds"].as_f64(), Some(cost.forward_seconds));
            assert_eq!(record["step_seconds"].as_f64(), Some(cost.step_seconds));
        }
    }
}
