package store

import "database/sql"

// SQLDB is d's database/sql handle, for benchmarks that measure the engine
// beneath the store with the store's own connection settings.
func SQLDB(d *DB) *sql.DB { return d.db }
