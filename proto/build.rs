//! Generates the gRPC code and the reflection descriptor set from `proto/`
//! with the vendored `protoc`, so a fresh machine needs no system protoc.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/kvroute/v1/common.proto", "proto/kvroute/v1/generate.proto", "proto/kvroute/v1/agent.proto"];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("kvroute_descriptor.bin"))
        .compile_with_config(config, &protos, &["proto"])?;
    Ok(())
}
