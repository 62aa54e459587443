# Multi-stage build: compile in the Rust image, run in a slim Debian image
# as an unprivileged user. Migrations are embedded in the binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
# The offline query data: the build has no database to check queries against.
COPY .cargo ./.cargo
COPY .sqlx ./.sqlx
COPY src ./src
# The benchmark's crate: a member of the Cargo workspace, so its manifest
# must be there for Cargo to read the workspace; the build below builds the
# service alone (no --workspace), not the benchmark.
COPY bench ./bench
COPY migrations ./migrations
COPY web ./web
# Without the default features: no embedded PostgreSQL (`embedded`), since a
# container runs on a Postgres server (DATABASE_URL), and so the image stays
# small; and no MCP server of the tests (`mcp-fixture`, rmcp's server side).
RUN cargo build --release --locked --no-default-features

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/warden warden \
    && mkdir -p /var/lib/warden/workspaces /var/lib/warden/keys /var/lib/warden/archive \
    && chmod 700 /var/lib/warden/keys \
    && chown -R warden /var/lib/warden
COPY --from=build /src/target/release/warden /usr/local/bin/warden
USER warden
WORKDIR /var/lib/warden
# 0.0.0.0 inside the container, so Warden refuses to start without
# WARDEN_ADMIN_TOKEN (or keys); publish it on the host's loopback:
#   docker run -e WARDEN_ADMIN_TOKEN=… -p 127.0.0.1:8080:8080 …
# The key sealing sessions' API keys, unless WARDEN_SECRET_KEY is given:
# generated on first start; keep /var/lib/warden/keys on a volume.
# Other settings: README, "Configuration"; `docker run --rm IMAGE config`
# prints the values in effect.
ENV WARDEN_LISTEN_ADDR=0.0.0.0:8080 \
    WARDEN_WORKSPACE_ROOT=/var/lib/warden/workspaces \
    WARDEN_SECRET_KEY_FILE=/var/lib/warden/keys/secret.key \
    WARDEN_ARCHIVE_DIR=/var/lib/warden/archive
EXPOSE 8080
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=5 CMD ["warden", "healthcheck"]
ENTRYPOINT ["warden"]
