package shard

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/outboxd/outboxd/internal/quote"

	"github.com/jackc/pglogrepl"
)

// Phase is the recorded step of a reshard in progress.
type Phase string

// The phases of a reshard, in order; RollingBack leaves Creating or
// Draining for the state before the reshard.
const (
	// Creating: the new shards' publications and slots are being made.
	Creating Phase = "creating"
	// Draining: the cutover X is recorded; the old shards deliver every
	// transaction ending at or before X, and nothing after it.
	Draining Phase = "draining"
	// Switched: every old slot has confirmed X. From here the reshard only
	// goes forward: the old slots are dropped, the new ones advanced to X.
	Switched Phase = "switched"
	// RollingBack: the new shards' slots and publications are being dropped.
	RollingBack Phase = "rolling_back"
)

// Plan is the reshard in progress, one row of the state table
// (StateTableSQL) keyed by the configured slot name.
type Plan struct {
	From, To int
	Phase    Phase
	Cutover  pglogrepl.LSN // X; zero before Draining
}

// Slot is a logical slot as pg_replication_slots shows it.
type Slot struct {
	Name      string
	Confirmed pglogrepl.LSN // confirmed_flush_lsn
	Active    bool
}

// View is what the caller observes before each step: the configuration,
// the state table's row and the database's slots and publications. Slots
// and publications whose names are not shard names of the configured bases
// are ignored.
type View struct {
	Slot, Publication string // the configured (base) names
	Want              int    // postgres.shards
	Plan              *Plan  // nil when the state table has no row
	Slots             []Slot
	Publications      []string
	// Delivered, in exactly-once mode, is for each old shard's slot the
	// position its transactional id committed in Kafka (past the end of a
	// Postgres transaction split over Kafka transactions whose rows are
	// only partly there, see Action Cutover). A killed instance may have
	// committed past its slot's confirmed position; the cutover is taken
	// at or past it. Nil when not read (at-least-once mode, or before the
	// Cutover action asks for it).
	Delivered map[string]pglogrepl.LSN
}

// Kind is what an Action asks the caller to do.
type Kind int

// The actions. Each is idempotent: the caller may be killed in the middle
// of any, and Next, given what it then observes, asks for it again or for
// what follows.
const (
	// Stream: run the pipelines of Shards (with their slots and
	// publications made as an unsharded outboxd makes its own when missing)
	// until stopped. The steady state.
	Stream Kind = iota + 1
	// Begin: insert Plan (phase Creating) into the state table, unless a
	// row is there.
	Begin
	// Create: create Publications (PublicationSQL, after the probe; for a
	// single shard, as an unsharded outboxd does) and then Slots (pgoutput).
	Create
	// Cutover: record phase Draining with cutover X = Cutover, only if the
	// row is still in phase Creating. Shards are the old shards: in
	// exactly-once mode, read the position each one's transactional id
	// committed in Kafka (fencing that id first, so that no instance of
	// the old layout commits after the read), pass them as
	// View.Delivered and call Next again before recording X.
	Cutover
	// Drain: run the pipelines of Shards (the old ones) with Window until
	// every one's slot has confirmed Window.Upto (Window.Done).
	Drain
	// Switch: record phase Switched, only if the row is in phase Draining.
	Switch
	// DropOld: drop Slots (terminating any backend that holds one) and
	// Publications.
	DropOld
	// Advance: pg_replication_slot_advance each of Slots to Cutover. They
	// are the slots behind it: Postgres refuses to move a slot backwards.
	Advance
	// Finish: delete the row.
	Finish
	// Rollback: record phase RollingBack, drop Slots (terminating any
	// holder) and Publications, then delete the row. The old shards have
	// delivered nothing after X and go on as before.
	Rollback
	// Wait: a slot that must be idle is held by another backend (Reason
	// says which); observe again after a while.
	Wait
)

var kindNames = [...]string{"", "stream", "begin", "create", "cutover", "drain", "switch", "drop_old", "advance", "finish", "rollback", "wait"}

func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Shard names one shard's slot and publication.
type Shard struct {
	Index, Count      int
	Slot, Publication string
}

// Action is the next step Next asks for.
type Action struct {
	Kind Kind
	// Plan is the row to insert for Begin; for every other action but
	// Stream, the row as observed. Write the row only where it still equals
	// Plan (UPDATE or DELETE ... WHERE phase = ... AND from_shards = ...
	// AND to_shards = ...), and observe again when no row matched: another
	// instance has moved on.
	Plan         Plan
	Shards       []Shard       // Stream, Drain, Cutover (the old shards)
	Window       Window        // Drain
	Cutover      pglogrepl.LSN // Cutover, Advance
	Slots        []string
	Publications []string
	Reason       string // Wait
}

// Next returns the next step towards Want shards, given what the caller
// observed. The caller performs it and calls Next again with a fresh View,
// until it gets Stream; a kill anywhere only means Next is called later
// with what the kill left. Next returns an error when the observed state is
// one no step can safely repair (a slot that held undelivered events is
// gone, or the configured count contradicts a reshard that cannot be
// undone); the error says what to do.
//
// The protocol, from N old shards to M new ones while writers write:
//
//  1. Begin records the plan; Create makes the M publications and slots.
//  2. When all exist and no slot is held, Cutover records X, the highest of
//     the new slots' consistent points (their confirmed_flush_lsn, which
//     nothing moves before step 4) and the old slots' confirmed positions,
//     and, in exactly-once mode, the old shards' positions committed in
//     Kafka (View.Delivered), which a killed instance leaves past its
//     slot's confirmed position. Every new slot holds every transaction
//     ending after X, and none of those is in Kafka.
//  3. Drain: the old shards deliver the transactions ending at or before X
//     and confirm X; nothing after X is delivered by them.
//  4. Switch, once every old slot has confirmed X. The new shards have not
//     delivered anything yet, so every event of a key up to X reached Kafka
//     before any later one can.
//  5. DropOld drops the old slots, so that no stale instance can deliver
//     past X from them; Advance moves the new slots to X, so they start
//     after it; Finish deletes the row; the new shards Stream.
//
// Setting Want back to N before step 4 rolls the reshard back; after it,
// only M is accepted.
//
// One instance at a time should run the loop: hold a session advisory lock
// (pg_try_advisory_lock, keyed by the slot name) on a connection of its own
// from the first Next to Stream; a killed holder's lock goes with its
// connection. The conditional writes of the row (see Action.Plan) keep an
// instance that lost the lock without knowing it from undoing another's
// steps.
func Next(v View) (Action, error) {
	if v.Want < 1 || v.Want > Max {
		return Action{}, fmt.Errorf("postgres.shards is %d; it must be between 1 and %d", v.Want, Max)
	}
	if v.Plan == nil {
		return steady(v)
	}
	a, err := planned(v, *v.Plan)
	if err != nil {
		return Action{}, err
	}
	a.Plan = *v.Plan
	return a, nil
}

// planned is Next with a recorded reshard p.
func planned(v View, p Plan) (Action, error) {
	if p.From < 1 || p.From > Max || p.To < 1 || p.To > Max || p.From == p.To {
		return Action{}, fmt.Errorf("the recorded reshard from %d to %d shards is invalid; delete its row from the state table and check the slots by hand", p.From, p.To)
	}
	old, err := layout(v, p.From)
	if err != nil {
		return Action{}, err
	}
	nu, err := layout(v, p.To)
	if err != nil {
		return Action{}, err
	}
	if p.Phase == RollingBack {
		return rollback(v, nu), nil
	}
	if v.Want != p.To {
		switch {
		case p.Phase == Switched:
			return Action{}, fmt.Errorf("a reshard from %d to %d shards is past its cutover and can only finish: set postgres.shards: %d", p.From, p.To, p.To)
		case v.Want == p.From:
			return rollback(v, nu), nil
		default:
			return Action{}, fmt.Errorf("a reshard from %d to %d shards is in progress; set postgres.shards: %d to finish it, or %d to roll it back, before changing to %d", p.From, p.To, p.To, p.From, v.Want)
		}
	}
	slots := slotMap(v.Slots)
	switch p.Phase {
	case Creating:
		if missing := absent(old, slots); len(missing) > 0 {
			return Action{}, fmt.Errorf("the old shards' slots %s are gone during a reshard from %d to %d shards; the events they held are lost to outboxd. Set postgres.shards: %d to roll back and recreate them", strings.Join(missing, ", "), p.From, p.To, p.From)
		}
		pubs := missingPubs(v, nu)
		ms := absent(nu, slots)
		if len(pubs) > 0 || len(ms) > 0 {
			return Action{Kind: Create, Publications: pubs, Slots: ms}, nil
		}
		var x pglogrepl.LSN
		for _, s := range append(slices.Clone(old), nu...) {
			sl := slots[s.Slot]
			if sl.Active {
				return Action{Kind: Wait, Reason: fmt.Sprintf("slot %q is in use; the cutover is taken when no slot of the old or new shards is", s.Slot)}, nil
			}
			x = max(x, sl.Confirmed)
		}
		for _, s := range old {
			x = max(x, v.Delivered[s.Slot])
		}
		return Action{Kind: Cutover, Cutover: x, Shards: old}, nil
	case Draining:
		if p.Cutover == 0 {
			return Action{}, fmt.Errorf("the reshard from %d to %d shards is draining without a recorded cutover; set postgres.shards: %d to roll it back", p.From, p.To, p.From)
		}
		if missing := absent(nu, slots); len(missing) > 0 {
			return Action{}, fmt.Errorf("the new shards' slots %s are gone after the cutover at %s was recorded; set postgres.shards: %d to roll the reshard back", strings.Join(missing, ", "), p.Cutover, p.From)
		}
		w := Window{Upto: p.Cutover}
		var drain []Shard
		for _, s := range old {
			sl, ok := slots[s.Slot]
			if !ok {
				return Action{}, fmt.Errorf("slot %q of the old shards is gone before it confirmed the cutover at %s; the events it held up to there are lost to outboxd. Recreating it cannot bring them back: check what reached Kafka, then set postgres.shards: %d to roll back", s.Slot, p.Cutover, p.From)
			}
			if !w.Done(sl.Confirmed) {
				drain = append(drain, s)
			}
		}
		if len(drain) > 0 {
			return Action{Kind: Drain, Shards: drain, Window: w}, nil
		}
		return Action{Kind: Switch}, nil
	case Switched:
		if p.Cutover == 0 {
			return Action{}, fmt.Errorf("the reshard from %d to %d shards has switched without a recorded cutover; the state table was changed by hand: check the slots and what reached Kafka, then delete the row", p.From, p.To)
		}
		if missing := absent(nu, slots); len(missing) > 0 {
			return Action{}, fmt.Errorf("the new shards' slots %s are gone after the switch at %s; the events after it that they held are lost to outboxd: recreate them by hand, check what reached Kafka, then delete the reshard's row from the state table", strings.Join(missing, ", "), p.Cutover)
		}
		dropSlots := present(old, slots)
		dropPubs := presentPubs(v, old)
		if len(dropSlots) > 0 || len(dropPubs) > 0 {
			return Action{Kind: DropOld, Slots: dropSlots, Publications: dropPubs}, nil
		}
		var behind []string
		for _, s := range nu {
			if slots[s.Slot].Confirmed < p.Cutover {
				behind = append(behind, s.Slot)
			}
		}
		if len(behind) > 0 {
			return Action{Kind: Advance, Slots: behind, Cutover: p.Cutover}, nil
		}
		return Action{Kind: Finish}, nil
	}
	return Action{}, fmt.Errorf("the state table records an unknown reshard phase %q", p.Phase)
}

// steady is Next without a recorded reshard.
func steady(v View) (Action, error) {
	want, err := layout(v, v.Want)
	if err != nil {
		return Action{}, err
	}
	counts := map[int]bool{}
	for _, s := range v.Slots {
		if _, n, ok := Parse(v.Slot, s.Name); ok {
			counts[n] = true
		}
	}
	all := slices.Sorted(maps.Keys(counts))
	others := slices.DeleteFunc(slices.Clone(all), func(n int) bool { return n == v.Want })
	switch {
	case len(others) == 0:
		return Action{Kind: Stream, Shards: want}, nil
	case len(all) > 1:
		return Action{}, fmt.Errorf("slots of %q for several shard counts (%v) exist and the state table records no reshard; drop the ones no outboxd uses (after checking what reached Kafka), keeping those of one count", v.Slot, all)
	}
	from := others[0]
	old, err := layout(v, from)
	if err != nil {
		return Action{}, err
	}
	if missing := absent(old, slotMap(v.Slots)); len(missing) > 0 {
		return Action{}, fmt.Errorf("cannot reshard from %d to %d shards: the slots %s of the %d shards are gone; the events they held are lost to outboxd", from, v.Want, strings.Join(missing, ", "), from)
	}
	return Action{Kind: Begin, Plan: Plan{From: from, To: v.Want, Phase: Creating}}, nil
}

func rollback(v View, nu []Shard) Action {
	return Action{Kind: Rollback, Slots: present(nu, slotMap(v.Slots)), Publications: presentPubs(v, nu)}
}

// layout names the n shards of the configured bases.
func layout(v View, n int) ([]Shard, error) {
	slots, err := Names(v.Slot, n)
	if err != nil {
		return nil, fmt.Errorf("postgres.slot: %w", err)
	}
	pubs, err := Names(v.Publication, n)
	if err != nil {
		return nil, fmt.Errorf("postgres.publication: %w", err)
	}
	out := make([]Shard, n)
	for i := range out {
		out[i] = Shard{Index: i, Count: n, Slot: slots[i], Publication: pubs[i]}
	}
	return out, nil
}

func slotMap(slots []Slot) map[string]Slot {
	m := make(map[string]Slot, len(slots))
	for _, s := range slots {
		m[s.Name] = s
	}
	return m
}

func absent(shards []Shard, slots map[string]Slot) []string {
	var out []string
	for _, s := range shards {
		if _, ok := slots[s.Slot]; !ok {
			out = append(out, s.Slot)
		}
	}
	return out
}

func present(shards []Shard, slots map[string]Slot) []string {
	var out []string
	for _, s := range shards {
		if _, ok := slots[s.Slot]; ok {
			out = append(out, s.Slot)
		}
	}
	return out
}

// missingPubs lists the shards' publications that do not exist.
func missingPubs(v View, shards []Shard) []string {
	var out []string
	for _, s := range shards {
		if !slices.Contains(v.Publications, s.Publication) {
			out = append(out, s.Publication)
		}
	}
	return out
}

// presentPubs lists the shards' publications that exist, except an
// unsharded layout's: that is the configured publication itself, which
// may be the user's and costs nothing without a slot, so resharding never
// drops it.
func presentPubs(v View, shards []Shard) []string {
	var out []string
	for _, s := range shards {
		if s.Count > 1 && slices.Contains(v.Publications, s.Publication) {
			out = append(out, s.Publication)
		}
	}
	return out
}

// StateTableSQL returns the statement that creates the state table in
// schema (the outbox table's): one row per reshard in progress, keyed by the
// configured slot name. outboxd creates it on the first reshard; it is
// empty when no reshard is in progress.
func StateTableSQL(schema string) string {
	return "CREATE TABLE IF NOT EXISTS " + quote.Ident(schema) + `.outboxd_reshard (
    slot        text        PRIMARY KEY,
    from_shards integer     NOT NULL CHECK (from_shards BETWEEN 1 AND ` + fmt.Sprint(Max) + `),
    to_shards   integer     NOT NULL CHECK (to_shards BETWEEN 1 AND ` + fmt.Sprint(Max) + `),
    phase       text        NOT NULL CHECK (phase IN ('creating', 'draining', 'switched', 'rolling_back')),
    cutover     pg_lsn,
    updated_at  timestamptz NOT NULL DEFAULT now()
)`
}

// Gate is how a pipeline may stream the slot it has just taken (GateFor).
type Gate struct {
	// Upto, when not zero, is the cutover: the slot is an old shard's
	// during a reshard, and the pipeline delivers up to it only
	// (Window{Upto: Upto}).
	Upto pglogrepl.LSN
	// Wait, when not empty, says why the pipeline must not stream the slot
	// now: it lets the slot go and looks again after a while.
	Wait string
}

// GateFor says how a pipeline that has just taken slot (START_REPLICATION
// succeeded: the slot is active) may stream it, given the configured base
// slot name, the reshard recorded in the state table (nil: none), read
// after the slot was taken, and whether the pipeline then got the reshard
// loop's advisory lock in shared mode (locked; it lets go of it at once).
//
// Any instance may hold an old slot after the cutover X is recorded: the
// other of an HA pair, or the old pod of a rolling update, configured for
// the old count. Streaming it past X would deliver what the new shards
// deliver after X (issue 32 item 5). So:
//
//   - an old shard's slot, once X is recorded, is streamed up to X only
//     (Upto), and not at all once its slot has confirmed X (confirmed; pass
//     0 for the drain of the instance that runs the reshard, which ends
//     there);
//   - a new shard's slot is not streamed while the reshard is recorded;
//   - otherwise, without a recorded X, a slot is streamed freely only when
//     locked: no reshard loop runs, and one that starts later sees the
//     slot held and records no cutover while it is.
func GateFor(base, slot string, plan *Plan, locked bool, confirmed pglogrepl.LSN) Gate {
	_, n, ok := Parse(base, slot)
	if !ok {
		return Gate{}
	}
	if plan != nil {
		switch {
		case n == plan.To:
			return Gate{Wait: fmt.Sprintf("slot %s is a new shard's of the reshard from %d to %d shards in progress; it streams once the reshard is done", slot, plan.From, plan.To)}
		case n == plan.From && (plan.Phase == Draining || plan.Phase == Switched) && plan.Cutover != 0:
			if confirmed != 0 && confirmed >= plan.Cutover {
				return Gate{Wait: fmt.Sprintf("slot %s has delivered every transaction up to the cutover %s of the reshard from %d to %d shards; the new shards deliver the rest. This outboxd is configured for %d shards: set postgres.shards: %d",
					slot, plan.Cutover, plan.From, plan.To, n, plan.To)}
			}
			return Gate{Upto: plan.Cutover}
		}
	}
	if !locked {
		return Gate{Wait: fmt.Sprintf("another outboxd is resharding the slots of %s; slot %s streams once the reshard has recorded its cutover or is done", base, slot)}
	}
	return Gate{}
}
