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

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="outboxd" \
      org.opencontainers.image.description="Transactional outbox from a PostgreSQL logical replication slot to Kafka" \
      org.opencontainers.image.source="https://github.com/outboxd/outboxd" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
COPY --from=build /out/outboxd /usr/local/bin/outboxd
# nonroot is uid/gid 65532 in distroless.
USER 65532:65532
# /metrics, /healthz, /readyz (http.listen, default :8080).
EXPOSE 8080
# distroless has no shell or curl: outboxd GETs its own /healthz.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/outboxd", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/outboxd"]
