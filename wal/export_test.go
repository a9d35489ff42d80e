package wal

// Aliases is aliases, for the decoder's external tests.
var Aliases = aliases
