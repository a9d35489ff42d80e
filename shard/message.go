package shard

// MessageOwner returns the shard that delivers a logical decoding message
// (pg_logical_emit_message) when there are n shards. Publications do not
// filter messages, so every shard's slot receives every one; each shard
// routes it (to learn its key) and delivers it only if MessageOwner returns
// its own index, and otherwise drops it as if the slot had never sent it.
//
// key is the message's key field as the router reads it, before
// router.key_encoding: the same bytes the key column would hold for a row.
// A keyed message goes to the shard of its key, Of(key, n), so a message and
// the rows with the same key keep their order (one shard delivers both, in
// commit order). A message without a key (keyed false: no key field, or
// null), or one that cannot be routed at all (its error is delivered, i.e.
// halts or goes to the dead-letter topic, once), belongs to shard 0.
func MessageOwner(key []byte, keyed bool, n int) int {
	checkCount(n)
	if !keyed {
		return 0
	}
	return Of(key, n)
}
