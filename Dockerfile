# For those who build images with a container daemon. This is NOT what the
# project builds, ships or tests: `make image` builds the same image from the
# Go build alone (hack/image, no daemon needed) and test/image checks that
# one. Keep the two alike: static binaries, nothing else, uid 65532.
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" -t informerd .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
ARG TARGETOS
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
	-ldflags "-s -w -X github.com/informerd/informerd/internal/version.Version=${VERSION}" \
	-o /out/ ./cmd/informerd ./cmd/informerctl

FROM gcr.io/distroless/static:nonroot
ARG VERSION=devel
LABEL org.opencontainers.image.title=informerd \
	org.opencontainers.image.version=${VERSION} \
	org.opencontainers.image.source=https://github.com/informerd/informerd
COPY --from=build /out/informerd /out/informerctl /
USER 65532:65532
ENTRYPOINT ["/informerd"]
