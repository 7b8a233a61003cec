package store

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/weave"
)

// PutCosts stores a project's prices in one transaction.
func (d *DB) PutCosts(ctx context.Context, costs []weave.Cost) error {
	tx, c, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("put costs: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for _, p := range costs {
		if _, err := c.exec(ctx, `INSERT INTO weave_costs (project_id, id, llm_id, prompt_token_cost,
			completion_token_cost, prompt_token_cost_unit, completion_token_cost_unit, effective_date,
			provider_id, created_at, created_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			p.ProjectID, p.ID, p.LLMID, p.PromptTokenCost, p.CompletionTokenCost, p.PromptTokenCostUnit,
			p.CompletionTokenCostUnit, formatTraceTime(p.EffectiveDate), p.ProviderID,
			formatTraceTime(p.CreatedAt), p.CreatedBy); err != nil {
			return fmt.Errorf("put costs: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("put costs: %w", err)
	}
	return nil
}

// ListCosts returns the project's prices, oldest first.
func (d *DB) ListCosts(ctx context.Context, projectID int64) ([]weave.Cost, error) {
	rows, err := d.conn().query(ctx, `SELECT id, llm_id, prompt_token_cost, completion_token_cost,
		prompt_token_cost_unit, completion_token_cost_unit, effective_date, provider_id, created_at, created_by
		FROM weave_costs WHERE project_id = ? ORDER BY created_at, id`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list costs: %w", err)
	}
	defer rows.Close()
	var out []weave.Cost
	for rows.Next() {
		p := weave.Cost{ProjectID: projectID}
		var effective, created string
		if err := rows.Scan(&p.ID, &p.LLMID, &p.PromptTokenCost, &p.CompletionTokenCost, &p.PromptTokenCostUnit,
			&p.CompletionTokenCostUnit, &effective, &p.ProviderID, &created, &p.CreatedBy); err != nil {
			return nil, fmt.Errorf("list costs: %w", err)
		}
		if p.EffectiveDate, err = parseTraceTime(effective); err != nil {
			return nil, err
		}
		if p.CreatedAt, err = parseTraceTime(created); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list costs: %w", err)
	}
	return out, nil
}

// DeleteCosts deletes prices by id.
func (d *DB) DeleteCosts(ctx context.Context, projectID int64, ids []string) (int, error) {
	return deleteByIDs(ctx, d.conn(), "weave_costs", projectID, ids)
}

// ProjectPrices returns the project's price in effect at at for each model
// it priced: of the prices effective by then, the latest effective, and of
// those the latest created.
func (d *DB) ProjectPrices(ctx context.Context, projectID int64, at time.Time) (map[string]weave.Price, error) {
	rows, err := d.conn().query(ctx, `SELECT llm_id, prompt_token_cost, completion_token_cost
		FROM weave_costs WHERE project_id = ? AND effective_date <= ?
		ORDER BY llm_id, effective_date DESC, created_at DESC, id DESC`, projectID, formatTraceTime(at))
	if err != nil {
		return nil, fmt.Errorf("project prices: %w", err)
	}
	defer rows.Close()
	out := make(map[string]weave.Price)
	for rows.Next() {
		var llm string
		var p weave.Price
		if err := rows.Scan(&llm, &p.PromptTokenCost, &p.CompletionTokenCost); err != nil {
			return nil, fmt.Errorf("project prices: %w", err)
		}
		if _, ok := out[llm]; !ok {
			out[llm] = p
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("project prices: %w", err)
	}
	return out, nil
}
