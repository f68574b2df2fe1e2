//! Command-line interface of the `gateway` binary.
