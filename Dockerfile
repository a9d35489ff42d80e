# Multi-stage build of a static outboxd on a minimal, non-root base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/outboxd ./cmd/outboxd

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/outboxd /usr/local/bin/outboxd
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/outboxd"]
