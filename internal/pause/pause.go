// Package pause pauses a polling or retrying loop for as long as its context
// lets it.
package pause

import (
	"context"
	"time"
)

// For waits d, or until ctx is done; it reports whether d passed.
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
