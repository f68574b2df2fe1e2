# The image of a node-agent (gRPC on 50061, /metrics and /health on 9101 in the chart).
# Build from the repository root:
#   docker build -f deploy/docker/node-agent.Dockerfile -t kvroute/node-agent:0.1.0 .
# The binary listens on loopback unless told otherwise: the Helm chart passes the addresses.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p kvroute-node-agent --bin node-agent

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin kvroute
COPY --from=build /src/target/release/node-agent /usr/local/bin/node-agent
USER 10001:10001
EXPOSE 50061 9101
ENTRYPOINT ["/usr/local/bin/node-agent"]
