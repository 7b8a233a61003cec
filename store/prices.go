package store

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
)

// priceMigrations keep the price history: every model's prices with the
// second they apply from, appended when the configured prices change, so
// that costs are priced at the prices in force when the usage happened.
var priceMigrations = []migration{
	{
		component: "prices",
		version:   1,
		sqlite: []string{
			`CREATE TABLE price_history (seq INTEGER PRIMARY KEY AUTOINCREMENT, model TEXT NOT NULL,
				prompt_per_mtok REAL NOT NULL, completion_per_mtok REAL NOT NULL, cached_prompt_per_mtok REAL NOT NULL,
				effective_from INTEGER NOT NULL)`,
		},
		postgres: []string{
			`CREATE TABLE price_history (seq BIGSERIAL PRIMARY KEY, model TEXT COLLATE "C" NOT NULL,
				prompt_per_mtok DOUBLE PRECISION NOT NULL, completion_per_mtok DOUBLE PRECISION NOT NULL,
				cached_prompt_per_mtok DOUBLE PRECISION NOT NULL, effective_from BIGINT NOT NULL)`,
		},
	},
}

// PriceHistory returns every price change, oldest first.
func (d *DB) PriceHistory(ctx context.Context) ([]accounting.PriceChange, error) {
	return priceHistory(ctx, d.conn())
}

func priceHistory(ctx context.Context, c conn) ([]accounting.PriceChange, error) {
	rows, err := c.query(ctx, `SELECT model, prompt_per_mtok, completion_per_mtok, cached_prompt_per_mtok, effective_from
		FROM price_history ORDER BY effective_from, seq`)
	if err != nil {
		return nil, fmt.Errorf("price history: %w", err)
	}
	defer rows.Close()
	var out []accounting.PriceChange
	for rows.Next() {
		var pc accounting.PriceChange
		var from int64
		if err := rows.Scan(&pc.Model, &pc.Pricing.PromptPerMTok, &pc.Pricing.CompletionPerMTok,
			&pc.Pricing.CachedPromptPerMTok, &from); err != nil {
			return nil, fmt.Errorf("price history: %w", err)
		}
		pc.From = time.Unix(from, 0).UTC()
		out = append(out, pc)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("price history: %w", err)
	}
	return out, nil
}

// RecordPrices appends to the price history the configured prices that
// differ from those in force, effective from the second after at: the
// gateway calls it at start and at every reload. Prices that did not
// change append nothing, so replicas with one configuration write once
// (two replicas starting at once may both append the same prices, which
// prices nothing differently).
func (d *DB) RecordPrices(ctx context.Context, configured map[string]config.Pricing, at time.Time) error {
	// The history is read before the write transaction: on SQLite, a
	// transaction that reads and then writes cannot wait for the usage
	// writer's lock, and fails at once.
	history, err := d.PriceHistory(ctx)
	if err != nil {
		return err
	}
	updates := accounting.PriceUpdates(history, configured, at)
	if len(updates) == 0 {
		return nil
	}
	tx, c, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("record prices: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for _, pc := range updates {
		if _, err := c.exec(ctx, `INSERT INTO price_history (model, prompt_per_mtok, completion_per_mtok,
			cached_prompt_per_mtok, effective_from) VALUES (?, ?, ?, ?, ?)`, pc.Model, pc.Pricing.PromptPerMTok,
			pc.Pricing.CompletionPerMTok, pc.Pricing.CachedPromptPerMTok, pc.From.Unix()); err != nil {
			return fmt.Errorf("record prices: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("record prices: %w", err)
	}
	return nil
}
