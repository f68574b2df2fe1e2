# The image of the gateway (HTTP API and /metrics on 8080, gRPC on 50051 in the chart).
# Build from the repository root:
#   docker build -f deploy/docker/gateway.Dockerfile -t kvroute/gateway:0.1.0 .
# The binary listens on loopback unless told otherwise: the Helm chart passes the addresses.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p kvroute-gateway --bin gateway

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin kvroute
COPY --from=build /src/target/release/gateway /usr/local/bin/gateway
USER 10001:10001
EXPOSE 8080 50051
ENTRYPOINT ["/usr/local/bin/gateway"]
