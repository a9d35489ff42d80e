package tables

import "github.com/outboxd/outboxd/wal"

// idChanged warns that outbox table i, met by name as rel, has another
// relation ID than the one known for it (read when the run started, or
// seen since): the table was replaced, or another table renamed to its
// name, so its rows are now routed by this entry. It warns again when
// rel's ID is also another outbox table's: the rows of that one relation
// now take this entry's settings, not the other's (review F7).
func (t *Outbox) idChanged(i int, rel *wal.Relation) {
	tb := &t.tables[i]
	if tb.id != 0 {
		t.log.Warn("outbox table "+tb.qualified()+" is another relation than when outboxd read it: it was replaced, or another table renamed to its name; "+
			"its rows are routed by the settings of "+tb.qualified(),
			"relation", rel.ID, "was", tb.id)
	}
	for j := range t.tables {
		if o := &t.tables[j]; j != i && o.id == rel.ID {
			t.log.Warn("the relation of outbox table "+o.qualified()+" now has the name of outbox table "+tb.qualified()+
				" (renamed): its rows are routed by the settings of "+tb.qualified()+", not those of "+o.qualified(),
				"relation", rel.ID)
		}
	}
}
