# Sluice: a static binary on a distroless base, running as non-root.
#   docker build -t sluice .         (or: make image)
#   docker run -p 8081:8081 -p 8080:8080 sluice
FROM golang:1.26-bookworm AS build
WORKDIR /src
# Dependencies first, so a code change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/sluice ./cmd/sluice

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /usr/local/bin/sluice
# Envoy Gateway runs its rate-limit image as /bin/ratelimit with
# envoyproxy/ratelimit's environment; under that name Sluice reads it
# (docs/envoy-gateway.md). A copy: distroless has no shell to link with.
COPY --from=build /out/sluice /bin/ratelimit
# The example rules, so the image runs as it is; mount your own over
# /etc/sluice/config (a ConfigMap volume is hot-reloaded).
COPY examples/config /etc/sluice/config
ENV SLUICE_CONFIG_DIR=/etc/sluice/config
USER nonroot:nonroot
# gRPC (Envoy's RateLimitService) and HTTP (/healthz, /readyz). The debug
# address stays on the container's loopback.
EXPOSE 8081 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD ["/usr/local/bin/sluice", "health"]
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve"]
