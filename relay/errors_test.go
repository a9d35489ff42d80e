package relay

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/delivery"
	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/internal/preflight"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// TestErrorsClassifyThemselves: every error type that reaches Run answers
// for itself whether a restart can fix it (IsPermanent), whether the slot is
// gone (SlotGone, exit 3) and what to do (Hint), wrapped or not, and says
// what is wrong on one line (issue 34 item 4). No server is needed: the
// server's own errors are judged by SQLSTATE (TestDecisionsByCode).
func TestErrorsClassifyThemselves(t *testing.T) {
	cfg := config.Default()
	cfg.Postgres.Publication, cfg.Postgres.Table = "outboxd", "public.outbox"
	r := preflight.New(cfg, shard.Shard{Index: 0, Count: 1}, nil, nil, nil)
	sharded := preflight.New(cfg, shard.Shard{Index: 1, Count: 2}, nil, nil, nil)
	pubGone := &pgconn.PgError{Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "55000", Routine: "LoadPublications",
		Message: "übersprungene Publikation »outboxd«"}
	lost := wal.CheckSlot(wal.SlotInfo{Name: "outboxd", Plugin: "pgoutput", Database: "app", WALStatus: "lost"}, "app", wal.RecreateRemedy(1, "outboxd", false))
	for _, tc := range []struct {
		name                  string
		err                   error
		permanent, gone, hint bool
	}{
		// Permanent: the same input fails again after a restart.
		{"poison row", fmt.Errorf("routing: %w", &router.RowError{EventID: "e1", Reason: "payload is not JSON"}), true, false, false},
		{"table layout", &router.LayoutError{Table: "public.outbox", Missing: []string{"aggregateid"}}, true, false, false},
		{"undecodable pgoutput", fmt.Errorf("slot %q: %w", "outboxd", &wal.DecodeError{LSN: 0x16B3748, Msg: "short message"}), true, false, false},
		{"UPDATE under on_update error", wal.Errorf(delivery.ErrUpdate, "UPDATE of an outbox row"), true, false, false},
		{"slot missing", fmt.Errorf("starting: %w", wal.Errorf(wal.ErrSlotMissing, "replication slot %q does not exist", "outboxd")), true, true, false},
		{"slot invalidated", lost, true, true, true},
		{"publication missing", wal.Errorf(wal.ErrPublicationMissing, "publication %q does not exist", "outboxd"), true, false, false},
		{"publication dropped", r.PublicationDropped(pubGone), true, false, true},
		{"sharded publication dropped", sharded.PublicationDropped(pubGone), true, false, true},
		{"record rejected by Kafka", &sink.DeliveryError{Topic: "t", EventID: "e1", Err: kerr.MessageTooLarge}, true, false, true},
		{"topic refused", &sink.TopicRefusedError{Topic: "t", Err: kerr.TopicAuthorizationFailed}, true, false, true},
		{"foreign position", eos.Own(eos.Position{Slot: "other"}, eos.Owner{Slot: "outboxd", ID: "x", Topic: "outboxd-positions"}), true, false, false},
		{"authentication", fmt.Errorf("connecting: %w", &pgconn.PgError{Code: "28P01", Message: "Passwort-Authentifizierung fehlgeschlagen"}), true, false, false},
		{"permanent beside a retriable one", fmt.Errorf("%w; %w", context.DeadlineExceeded, wal.Errorf(wal.ErrSlotLost, "invalidated")), true, true, false},
		// Retriable: the next run may succeed.
		{"delivery timed out", &sink.DeliveryError{Topic: "t", EventID: "e1", Err: kerr.RequestTimedOut}, false, false, false},
		{"Kafka stalled", &sink.StallError{InFlight: 3}, false, false, false},
		{"fenced by another outboxd", &sink.FencedError{TransactionalID: "x", Err: kerr.ProducerFenced}, false, false, false},
		{"silent server", wal.Errorf(wal.ErrSilentServer, "nothing came from the server"), false, false, false},
		{"slot held by another process", &wal.SlotActiveError{Slot: "outboxd", PID: 42}, false, false, false},
		{"split brain", &preflight.SplitBrainError{Server: "a:5432", Timeline: 1, Seen: 2}, false, false, false},
		{"reshard under way", &ReshardWaitError{Reason: "a reshard is under way"}, false, false, false},
		{"server shutting down", &pgconn.PgError{Code: "57P01", Message: "terminating connection"}, false, false, false},
		{"slot or publication gone, not yet judged", &pgconn.PgError{Code: "42704", Message: `replication slot "outboxd" does not exist`}, false, false, false},
		{"cancelled", fmt.Errorf("receiving: %w", context.Canceled), false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsPermanent(tc.err); got != tc.permanent {
				t.Errorf("IsPermanent(%v) = %v, want %v", tc.err, got, tc.permanent)
			}
			if got := SlotGone(tc.err); got != tc.gone {
				t.Errorf("SlotGone(%v) = %v, want %v", tc.err, got, tc.gone)
			}
			hint := Hint(tc.err)
			if (hint != "") != tc.hint {
				t.Errorf("Hint(%v) = %q, want one: %v", tc.err, hint, tc.hint)
			}
			if strings.Contains(tc.err.Error(), "\n") {
				t.Errorf("%q is more than one line", tc.err)
			}
			if strings.Contains(hint, "\n") {
				t.Errorf("hint %q is more than one line", hint)
			}
		})
	}
}

// TestPublicationDroppedSaysWhatToDo: the hint of a dropped publication is
// the statement that creates it again, the shard's own when sharded.
func TestPublicationDroppedSaysWhatToDo(t *testing.T) {
	cfg := config.Default()
	cfg.Postgres.Publication, cfg.Postgres.Table, cfg.Router.KeyColumn = "outboxd", "public.outbox", "aggregate_id"
	pubGone := &pgconn.PgError{SeverityUnlocalized: "WARNING", Code: "55000", Routine: "LoadPublications", Message: "skipped"}
	for _, sh := range []shard.Shard{{Index: 0, Count: 1}, {Index: 1, Count: 2}} {
		err := preflight.New(cfg, sh, nil, nil, nil).PublicationDropped(pubGone)
		want := wal.PublicationSQL("outboxd", "public", "outbox")
		if sh.Count > 1 {
			want = shard.PublicationSQL("outboxd", []shard.Table{{Schema: "public", Name: "outbox", KeyColumn: "aggregate_id"}}, sh.Index, sh.Count)
		}
		if !errors.Is(err, wal.ErrPublicationMissing) || !strings.Contains(Hint(err), want) || strings.Contains(err.Error(), want) {
			t.Errorf("shard %d of %d: %v (hint %q), want wal.ErrPublicationMissing with %s in the hint alone", sh.Index, sh.Count, err, Hint(err), want)
		}
		if !strings.Contains(err.Error(), `publication "outboxd" was dropped while outboxd used it`) {
			t.Errorf("shard %d of %d: %q does not say what happened", sh.Index, sh.Count, err)
		}
	}
}

// TestHintOuterFirst: of several hints in a chain, the outermost counts; an
// error whose Hint is "" (a delivery failure a restart retries) gives way to
// one it wraps.
func TestHintOuterFirst(t *testing.T) {
	inner := &wal.Error{Kind: wal.ErrSlotMissing, Msg: "gone", Remedy: "inner"}
	outer := &wal.Error{Kind: wal.ErrSlotMissing, Msg: "gone", Remedy: "outer"}
	if got := Hint(fmt.Errorf("%w: %w", outer, inner)); got != "outer" {
		t.Errorf("Hint = %q, want outer", got)
	}
	if got := Hint(&sink.DeliveryError{Err: inner}); got != "inner" {
		t.Errorf("Hint of a retried delivery error = %q, want the hint it wraps", got)
	}
	if got := Hint(errors.New("plain")); got != "" {
		t.Errorf("Hint of a plain error = %q, want none", got)
	}
}

// TestNoDecisionReadsMessageText: no code of the engine branches on an
// error's text (strings.Contains, HasPrefix, ... or a regexp on Error() or
// a server's Message): servers speak other languages, and a reworded
// message must not change a decision (issue 34 item 4). Errors answer for
// themselves instead (TestErrorsClassifyThemselves).
func TestNoDecisionReadsMessageText(t *testing.T) {
	textFuncs := map[string]bool{"Contains": true, "ContainsAny": true, "HasPrefix": true, "HasSuffix": true, "Index": true,
		"EqualFold": true, "Cut": true, "MatchString": true, "FindString": true, "FindStringSubmatch": true}
	// The root module: the daemon and the libraries.
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || hasGoMod(path)):
			return filepath.SkipDir // another module (test/) or no code
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			fn, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !textFuncs[fn.Sel.Name] {
				return true
			}
			for _, arg := range call.Args {
				if readsMessage(arg) {
					t.Errorf("%s: %s reads an error's text to decide", fset.Position(call.Pos()), fn.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func hasGoMod(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// readsMessage reports an expression that is an error's text: x.Error()
// or x.Message (pgconn.PgError's).
func readsMessage(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.CallExpr:
		sel, ok := e.Fun.(*ast.SelectorExpr)
		return ok && sel.Sel.Name == "Error" && len(e.Args) == 0
	case *ast.SelectorExpr:
		return e.Sel.Name == "Message"
	}
	return false
}

// A position written for another slot or database is refused for good:
// a restart would fence the other deployment again (issue 32 item 2; the
// cases are internal/eos/testdata/owner.txt).
func TestRefusedPositionIsPermanent(t *testing.T) {
	err := eos.Own(eos.Position{LSN: 0x100, Slot: "billing"}, eos.Owner{Slot: "orders", ID: "shared", Topic: "outboxd-positions"})
	if err == nil || !IsPermanent(err) {
		t.Errorf("IsPermanent(%v) = false: the run would restart and fence the other deployment again", err)
	}
}
