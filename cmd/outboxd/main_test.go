package main

import (
	"io"
	"strings"
	"testing"
)

// With the HTTP server off there is nothing to probe: healthcheck says so
// instead of failing on a URL without a host.
func TestHealthcheckWithoutHTTP(t *testing.T) {
	t.Setenv("OUTBOXD_HTTP_LISTEN", "")
	err := run([]string{"healthcheck"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "http.listen is empty") {
		t.Fatalf("healthcheck with http.listen empty: %v; want it to say that there is nothing to probe", err)
	}
}
