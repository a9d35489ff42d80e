package reshard

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/wal"
)

// fakeDB is a database of slots, publications and the state table's row.
// The WAL is a counter: wal is the current insert position.
type fakeDB struct {
	plan  *shard.Plan
	slots map[string]*shard.Slot
	pubs  map[string]bool
	wal   wal.LSN
	// failAt makes the nth call (counting every call) fail once.
	calls, failAt int
	log           []string
}

var errInjected = errors.New("injected")

func newFake(slots ...string) *fakeDB {
	f := &fakeDB{slots: map[string]*shard.Slot{}, pubs: map[string]bool{}, wal: 100}
	for _, s := range slots {
		f.slots[s] = &shard.Slot{Name: s, Confirmed: 50}
		f.pubs[s] = true // slot and publication bases are the same in these tests
	}
	return f
}

func (f *fakeDB) step(name string) error {
	f.calls++
	f.wal += 10 // writers write
	f.log = append(f.log, name)
	if f.calls == f.failAt {
		return errInjected
	}
	return nil
}

func (f *fakeDB) Observe(context.Context) (Observed, error) {
	var o Observed
	if f.plan != nil {
		p := *f.plan
		o.Plan = &p
	}
	for _, k := range slices.Sorted(maps.Keys(f.slots)) {
		o.Slots = append(o.Slots, *f.slots[k])
	}
	o.Publications = slices.Sorted(maps.Keys(f.pubs))
	return o, nil
}

func (f *fakeDB) Begin(_ context.Context, p shard.Plan) error {
	if err := f.step("begin"); err != nil {
		return err
	}
	if f.plan == nil {
		f.plan = &p
	}
	return nil
}

func (f *fakeDB) CreatePublications(_ context.Context, names []string, fix bool) error {
	step := "check_publications"
	if fix {
		step = "create_publications"
	}
	if err := f.step(step + " " + strings.Join(names, ",")); err != nil {
		return err
	}
	for _, n := range names {
		f.pubs[n] = true
	}
	return nil
}

func (f *fakeDB) CreateSlots(_ context.Context, names []string) error {
	if err := f.step("create_slots"); err != nil {
		return err
	}
	for _, n := range names {
		if f.slots[n] == nil {
			f.slots[n] = &shard.Slot{Name: n, Confirmed: f.wal}
		}
	}
	return nil
}

func (f *fakeDB) CutoverLSN(context.Context) (wal.LSN, error) {
	if err := f.step("cutover_lsn"); err != nil {
		return 0, err
	}
	return f.wal, nil
}

func (f *fakeDB) SetPhase(_ context.Context, o shard.Plan, phase shard.Phase, cutover wal.LSN) (bool, error) {
	if err := f.step("phase " + string(phase)); err != nil {
		return false, err
	}
	if f.plan == nil || *f.plan != o {
		return false, nil
	}
	f.plan.Phase = phase
	if cutover != 0 {
		f.plan.Cutover = cutover
	}
	return true, nil
}

func (f *fakeDB) DropSlots(_ context.Context, names []string) error {
	if err := f.step("drop_slots"); err != nil {
		return err
	}
	for _, n := range names {
		delete(f.slots, n)
	}
	return nil
}

func (f *fakeDB) DropPublications(_ context.Context, names []string) error {
	if err := f.step("drop_publications"); err != nil {
		return err
	}
	for _, n := range names {
		delete(f.pubs, n)
	}
	return nil
}

func (f *fakeDB) Advance(_ context.Context, names []string, to wal.LSN) error {
	if err := f.step("advance"); err != nil {
		return err
	}
	for _, n := range names {
		if s := f.slots[n]; s != nil && s.Confirmed < to {
			s.Confirmed = to
		}
	}
	return nil
}

func (f *fakeDB) Delete(_ context.Context, o shard.Plan) (bool, error) {
	if err := f.step("delete"); err != nil {
		return false, err
	}
	if f.plan == nil || *f.plan != o {
		return false, nil
	}
	f.plan = nil
	return true, nil
}

// drain confirms the window's end on each old slot, as the old shards'
// pipelines do.
func (f *fakeDB) drain(_ context.Context, shards []shard.Shard, w shard.Window) error {
	if err := f.step("drain"); err != nil {
		return err
	}
	for _, s := range shards {
		if w.Upto < f.slots[s.Slot].Confirmed {
			return errors.New("the window ends before the slot's confirmed position")
		}
		f.slots[s.Slot].Confirmed = w.Upto
	}
	return nil
}

func run(t *testing.T, f *fakeDB, want int) ([]shard.Shard, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shards, _, err := Run(ctx, f, Config{Slot: "outboxd", Publication: "outboxd", Want: want, Poll: time.Millisecond}, f.drain,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	return shards, err
}

func slotNames(f *fakeDB) []string { return slices.Sorted(maps.Keys(f.slots)) }

func TestRunReshards(t *testing.T) {
	tests := []struct {
		name  string
		slots []string
		want  int
		after []string
	}{
		{"1 to 2", []string{"outboxd"}, 2, []string{"outboxd_0of2", "outboxd_1of2"}},
		{"4 to 2", []string{"outboxd_0of4", "outboxd_1of4", "outboxd_2of4", "outboxd_3of4"}, 2, []string{"outboxd_0of2", "outboxd_1of2"}},
		{"2 to 1", []string{"outboxd_0of2", "outboxd_1of2"}, 1, []string{"outboxd"}},
		{"steady", []string{"outboxd_0of2", "outboxd_1of2"}, 2, []string{"outboxd_0of2", "outboxd_1of2"}},
		{"nothing yet", nil, 4, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(tt.slots...)
			shards, err := run(t, f, tt.want)
			if err != nil {
				t.Fatalf("Run: %v (steps %v)", err, f.log)
			}
			if len(shards) != tt.want {
				t.Fatalf("Run returned %d shards, want %d", len(shards), tt.want)
			}
			if got := slotNames(f); !slices.Equal(got, tt.after) {
				t.Errorf("slots after the reshard: %v, want %v (steps %v)", got, tt.after, f.log)
			}
			if f.plan != nil {
				t.Errorf("the state table still has a row: %+v", *f.plan)
			}
			if len(tt.slots) > 0 && tt.after[0] != tt.slots[0] {
				// Every new slot starts at the cutover, which every old slot
				// confirmed before it was dropped.
				var x wal.LSN
				for _, s := range f.slots {
					if x != 0 && s.Confirmed != x {
						t.Errorf("new slots at different positions: %v", f.slots)
					}
					x = s.Confirmed
				}
			}
		})
	}
}

// TestRunResumesAfterAFailedStep fails each step in turn (as a kill or a
// lost connection would leave it) and checks the loop carries on to the
// same end.
func TestRunResumesAfterAFailedStep(t *testing.T) {
	for failAt := 1; failAt <= 12; failAt++ {
		f := newFake("outboxd_0of4", "outboxd_1of4", "outboxd_2of4", "outboxd_3of4")
		f.failAt = failAt
		if _, err := run(t, f, 2); err != nil {
			t.Fatalf("fail at step %d: Run: %v", failAt, err)
		}
		if got := slotNames(f); !slices.Equal(got, []string{"outboxd_0of2", "outboxd_1of2"}) || f.plan != nil {
			t.Errorf("fail at step %d: slots %v, row %v (steps %v)", failAt, got, f.plan, f.log)
		}
	}
}

// TestRunRollsBack: a reshard stopped while draining, with the old count
// configured again, drops the new shards and leaves the old ones as they
// were.
func TestRunRollsBack(t *testing.T) {
	f := newFake("outboxd")
	f.plan = &shard.Plan{From: 1, To: 2, Phase: shard.Draining, Cutover: 90}
	f.slots["outboxd_0of2"] = &shard.Slot{Name: "outboxd_0of2", Confirmed: 90}
	f.slots["outboxd_1of2"] = &shard.Slot{Name: "outboxd_1of2", Confirmed: 80}
	f.pubs["outboxd_0of2"], f.pubs["outboxd_1of2"] = true, true
	shards, err := run(t, f, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) != 1 || shards[0].Slot != "outboxd" {
		t.Errorf("Run returned %+v, want the one old shard", shards)
	}
	if got := slotNames(f); !slices.Equal(got, []string{"outboxd"}) || f.plan != nil || f.slots["outboxd"].Confirmed != 50 {
		t.Errorf("after the rollback: slots %v, row %v", f.slots, f.plan)
	}
}

// TestRunStopsOnPermanentErrors: a step's PermanentError ends the loop.
func TestRunStopsOnPermanentErrors(t *testing.T) {
	f := newFake("outboxd")
	perm := &PermanentError{Err: errors.New("create_publication is false")}
	ctx := context.Background()
	_, _, err := Run(ctx, permDB{f, perm}, Config{Slot: "outboxd", Publication: "outboxd", Want: 2, Poll: time.Millisecond}, f.drain,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, perm) {
		t.Fatalf("Run = %v, want the permanent error", err)
	}
}

type permDB struct {
	*fakeDB
	err error
}

func (p permDB) CreatePublications(context.Context, []string, bool) error { return p.err }

// Review of issue 35 §1, M1: every publication of the new layout, an
// existing one too, is checked before the new slots are made (where it may
// be put right) and again before the cutover is recorded (where it can only
// be refused): a table one lacks would lose its rows after the cutover. A
// refusal there leaves the reshard creating, with the old slots.
func TestRunChecksEveryNewPublication(t *testing.T) {
	f := newFake("outboxd_0of2", "outboxd_1of2")
	f.pubs["outboxd"] = true // made earlier: not created, but checked
	if _, err := run(t, f, 1); err != nil {
		t.Fatalf("Run: %v (steps %v)", err, f.log)
	}
	create := slices.Index(f.log, "create_publications outboxd")
	check := slices.Index(f.log, "check_publications outboxd")
	slots := slices.Index(f.log, "create_slots")
	cutover := slices.Index(f.log, "phase draining")
	if create < 0 || check < 0 || !(create < slots && slots < check && check < cutover) {
		t.Errorf("steps %v, want the new publication checked (may fix) before create_slots and checked (refusing) before phase draining", f.log)
	}

	f = newFake("outboxd_0of2", "outboxd_1of2")
	refused := &PermanentError{Err: errors.New(`publication "outboxd" does not include "orders"."events"`)}
	_, _, err := Run(context.Background(), refuseCheck{f, refused}, Config{Slot: "outboxd", Publication: "outboxd", Want: 1, Poll: time.Millisecond}, f.drain,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, refused) || !strings.Contains(err.Error(), "set postgres.shards: 2 to roll the reshard back") || !strings.Contains(err.Error(), "run what is named with outboxd stopped and start outboxd again") {
		t.Fatalf("Run = %v, want the refusal with the way back", err)
	}
	if f.plan == nil || f.plan.Phase != shard.Creating || f.slots["outboxd_0of2"] == nil || f.slots["outboxd_1of2"] == nil || slices.Contains(f.log, "phase draining") {
		t.Errorf("after the refusal: row %+v, slots %v (steps %v), want the reshard creating with the old slots", f.plan, slotNames(f), f.log)
	}
}

// Second review of issue 35 §1, S1: the cutover is taken past the WAL
// write position read after the check before it passed, not only past
// the slots' positions observed before the check: a publication put right
// by hand after the new slots were made (as the check's refusal names) is
// then right for every transaction the new shards deliver.
func TestRunCutoverAfterTheCheck(t *testing.T) {
	f := newFake("outboxd_0of2", "outboxd_1of2")
	var checked wal.LSN
	c := checkAt{f, &checked}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, w, err := Run(ctx, c, Config{Slot: "outboxd", Publication: "outboxd", Want: 3, Poll: time.Millisecond}, f.drain,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("Run: %v (steps %v)", err, f.log)
	}
	if checked == 0 || w.After < checked {
		t.Errorf("cutover %s, before the WAL position %s at which the check before it passed (steps %v)", w.After, checked, f.log)
	}
}

// checkAt records the WAL position of the check before the cutover's wait
// (the first without fix).
type checkAt struct {
	*fakeDB
	at *wal.LSN
}

func (c checkAt) CreatePublications(ctx context.Context, names []string, fix bool) error {
	err := c.fakeDB.CreatePublications(ctx, names, fix)
	if !fix && err == nil && *c.at == 0 {
		*c.at = c.wal
	}
	return err
}

// Fourth review of issue 35 §1, S3: the publications are checked again
// after the cutover's wait for open transactions, which lasts as long as
// the oldest one, and a refusal then records no cutover.
func TestRunChecksAgainAfterTheWait(t *testing.T) {
	f := newFake("outboxd_0of2", "outboxd_1of2")
	refused := &PermanentError{Err: errors.New(`publication "outboxd_2of3" does not include "public"."events"`)}
	_, _, err := Run(context.Background(), refuseAfterWait{f, refused}, Config{Slot: "outboxd", Publication: "outboxd", Want: 3, Poll: time.Millisecond}, f.drain,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, refused) {
		t.Fatalf("Run = %v (steps %v), want the refusal of the check after the wait", err, f.log)
	}
	if f.plan == nil || f.plan.Phase != shard.Creating || slices.Contains(f.log, "phase draining") {
		t.Errorf("after the refusal: row %+v (steps %v), want the reshard creating", f.plan, f.log)
	}
}

// refuseAfterWait refuses the check before the cutover once CutoverLSN
// has waited.
type refuseAfterWait struct {
	*fakeDB
	err error
}

func (r refuseAfterWait) CreatePublications(ctx context.Context, names []string, fix bool) error {
	if !fix && slices.Contains(r.log, "cutover_lsn") {
		return r.err
	}
	return r.fakeDB.CreatePublications(ctx, names, fix)
}

// refuseCheck refuses the check before the cutover.
type refuseCheck struct {
	*fakeDB
	err error
}

func (r refuseCheck) CreatePublications(ctx context.Context, names []string, fix bool) error {
	if !fix {
		return r.err
	}
	return r.fakeDB.CreatePublications(ctx, names, fix)
}

// Issue 32 item 6: Run returns the window to stream the new shards with:
// after the cutover it advanced them to; none when it resharded nothing.
func TestRunReturnsTheNewShardsWindow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := newFake("outboxd_0of2", "outboxd_1of2")
	_, w, err := Run(ctx, f, Config{Slot: "outboxd", Publication: "outboxd", Want: 4, Poll: time.Millisecond}, f.drain, log)
	if err != nil {
		t.Fatal(err)
	}
	if w.After == 0 || w.Upto != 0 {
		t.Errorf("after a reshard: window %+v, want one after the cutover", w)
	}
	for _, s := range slotNames(f) {
		if f.slots[s].Confirmed < w.After {
			t.Errorf("slot %s at %s, before the window's start %s", s, f.slots[s].Confirmed, w.After)
		}
	}
	if _, w, err = Run(ctx, f, Config{Slot: "outboxd", Publication: "outboxd", Want: 4, Poll: time.Millisecond}, f.drain, log); err != nil || w != (shard.Window{}) {
		t.Errorf("nothing to reshard: window %+v, err %v", w, err)
	}
}

// In exactly-once mode a killed instance may have committed Kafka
// transactions past its slot's confirmed position: Run reads the old
// shards' positions in Kafka before it records the cutover, and takes the
// cutover at or past them; a failed read is tried again.
func TestRunCutoverAtTheKafkaPositions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFake("outboxd_0of2", "outboxd_1of2")
	var asked [][]string
	reads := 0
	delivered := func(_ context.Context, old []shard.Shard) (map[string]wal.LSN, error) {
		reads++
		if reads == 1 {
			return nil, errInjected
		}
		var names []string
		for _, s := range old {
			names = append(names, s.Slot)
		}
		asked = append(asked, names)
		// Far past anything the slots confirmed or the new slots' creation.
		return map[string]wal.LSN{"outboxd_1of2": f.wal + 1000}, nil
	}
	want := f.wal + 1000
	_, w, err := Run(ctx, f, Config{Slot: "outboxd", Publication: "outboxd", Want: 4, Poll: time.Millisecond, Delivered: delivered}, f.drain,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("Run: %v (steps %v)", err, f.log)
	}
	if w.After < want {
		t.Errorf("cutover %s, before the old shard's position in Kafka %s", w.After, want)
	}
	if len(asked) != 1 || !slices.Equal(asked[0], []string{"outboxd_0of2", "outboxd_1of2"}) {
		t.Errorf("positions read for %v, want once for both old shards (after one failed read)", asked)
	}
	for _, s := range slotNames(f) {
		if f.slots[s].Confirmed < w.After {
			t.Errorf("slot %s at %s, before the cutover %s", s, f.slots[s].Confirmed, w.After)
		}
	}
}
