# syntax=docker/dockerfile:1
# outboxd image: a static binary (CGO off) on distroless, run as non-root.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#                --build-arg COMMIT=$(git rev-parse HEAD) -t outboxd .
#
# Multi-arch: docker buildx build --platform linux/amd64,linux/arm64 ... (the
# Go toolchain cross-compiles; nothing runs under emulation).
# Checked by go test ./deploy (parsing only: no container engine runs on the
# development machine or in CI).

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
ARG COMMIT=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/outboxd ./cmd/outboxd
# The configuration file CMD and HEALTHCHECK read: empty (the defaults) until
# you mount yours over it; OUTBOXD_* variables override either.
RUN printf '%s\n' '# outboxd configuration: the defaults. Mount yours over this file' \
      '# (-v ./outboxd.yaml:/etc/outboxd/outboxd.yaml:ro) or set OUTBOXD_* variables.' \
      > /out/outboxd.yaml

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="outboxd" \
      org.opencontainers.image.description="Transactional outbox from a PostgreSQL logical replication slot to Kafka" \
      org.opencontainers.image.source="https://github.com/outboxd/outboxd" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
COPY --from=build /out/outboxd /usr/local/bin/outboxd
COPY --from=build /out/outboxd.yaml /etc/outboxd/outboxd.yaml
# nonroot is uid/gid 65532 in distroless.
USER 65532:65532
# /metrics, /healthz, /readyz (http.listen, default :8080).
EXPOSE 8080
# distroless has no shell or curl: outboxd GETs its own /healthz, at the
# address http.listen names in the same configuration file the process reads
# (with the same OUTBOXD_* environment). Keep the two -config paths equal
# (go test ./deploy checks it); if you run the image with another -config,
# pass --health-cmd with that -config too.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/outboxd", "healthcheck", "-config", "/etc/outboxd/outboxd.yaml"]
# docker stop waits 10s by default, as long as shutdown_timeout: run with
# --stop-timeout 30 so a stop never kills outboxd while it drains.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/outboxd"]
CMD ["-config", "/etc/outboxd/outboxd.yaml"]
