package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/store"
)

// runUsage implements `tollgate usage`: a table of the tokens used recently
// and their cost, read from the store and priced as the costs API prices
// them (the store's price history, the configuration's prices for a model
// it lacks). SQLite in WAL mode lets it read while the gateway
// writes.
func runUsage(args []string, stdout io.Writer) error {
	flags := flag.NewFlagSet("tollgate usage", flag.ContinueOnError)
	// Parse errors are returned (main prints them once); help goes to stdout.
	flags.SetOutput(io.Discard)
	configPath := flags.String("config", os.Getenv("TOLLGATE_CONFIG"), "configuration `file` (default: the embedded config.example.yaml; env TOLLGATE_CONFIG)")
	since := flags.Duration("since", 24*time.Hour, "report usage of this `duration` up to now")
	by := flags.String("by", "project", "group the table by `project|model|key|endpoint|status`; by status, REQUESTS counts refusals too")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			flags.SetOutput(stdout)
			fmt.Fprintln(stdout, "usage: tollgate usage [-config FILE] [-since 24h] [-by project|model|key|endpoint|status]")
			flags.PrintDefaults()
		}
		return fmt.Errorf("usage: %w", err)
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("usage: unexpected argument %q", flags.Arg(0))
	}
	if *since <= 0 {
		return fmt.Errorf("usage: -since %v: want a positive duration", *since)
	}
	column, ok := usageColumnFor(*by)
	if !ok {
		return fmt.Errorf("usage: -by %q: want project, model, key, endpoint or status", *by)
	}

	cfg, err := loadConfig(*configPath)
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	// Opening a missing SQLite file would create an empty store; say
	// instead that there is nothing to read.
	if cfg.Store.Driver == "" || cfg.Store.Driver == "sqlite" {
		if _, err := os.Stat(cfg.Store.Path); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("usage: no store at %s: the gateway has recorded no usage with this configuration", cfg.Store.Path)
		}
	}
	ctx := context.Background()
	db, err := store.Open(ctx, cfg.Store)
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	defer db.Close()

	end := time.Now().UTC()
	q := accounting.UsageQuery{Start: end.Add(-*since), End: end, BucketWidth: *since}
	column.group(&q)
	rows, err := accounting.ReadCosts(ctx, db, modelPricing(cfg), q)
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	return printUsage(stdout, rows, column, q)
}

// usageColumn is what -by groups by: the table's first column.
type usageColumn struct {
	title string
	group func(*accounting.UsageQuery)
	name  func(accounting.UsageRow) string
	// allRecords makes REQUESTS count every record, refusals that reached
	// no backend included, rather than the requests a backend served:
	// by status, a refusal's row would otherwise read 0.
	allRecords bool
}

// usageColumnFor returns the column -by names.
func usageColumnFor(by string) (usageColumn, bool) {
	switch by {
	case "project":
		return usageColumn{
			title: "PROJECT",
			group: func(q *accounting.UsageQuery) { q.GroupByProject = true },
			name:  func(r accounting.UsageRow) string { return r.Team + "/" + r.Project },
		}, true
	case "model":
		return usageColumn{
			title: "MODEL",
			group: func(q *accounting.UsageQuery) { q.GroupByModel = true },
			name:  func(r accounting.UsageRow) string { return r.Model },
		}, true
	case "key":
		return usageColumn{
			title: "KEY",
			group: func(q *accounting.UsageQuery) { q.GroupByKey = true },
			name:  func(r accounting.UsageRow) string { return r.KeyName },
		}, true
	case "endpoint":
		return usageColumn{
			title: "ENDPOINT",
			group: func(q *accounting.UsageQuery) { q.GroupByEndpoint = true },
			name:  func(r accounting.UsageRow) string { return r.Endpoint },
		}, true
	case "status":
		// The outcomes of accounting.UsageStatuses: client_closed and
		// stream_broken are the incomplete (aborted) requests.
		return usageColumn{
			title:      "STATUS",
			group:      func(q *accounting.UsageQuery) { q.GroupByStatus = true },
			name:       func(r accounting.UsageRow) string { return r.Status },
			allRecords: true,
		}, true
	}
	return usageColumn{}, false
}

// printUsage writes rows, summed by the column's name, as a table, largest
// total first, and a totals line. Sums saturate at 2^63-1 as the store's
// do, so that counts a backend over-reported print as the largest number
// rather than a negative one. COST is in US dollars.
func printUsage(w io.Writer, priced []accounting.CostRow, column usageColumn, q accounting.UsageQuery) error {
	add := func(sum *accounting.CostRow, r accounting.CostRow) {
		sum.Requests += r.Requests
		sum.Records += r.Records
		sum.InputTokens = accounting.AddTokens(sum.InputTokens, r.InputTokens)
		sum.CachedTokens = accounting.AddTokens(sum.CachedTokens, r.CachedTokens)
		sum.OutputTokens = accounting.AddTokens(sum.OutputTokens, r.OutputTokens)
		sum.Cost.Input += r.Cost.Input
		sum.Cost.CachedInput += r.Cost.CachedInput
		sum.Cost.CacheWriteInput += r.Cost.CacheWriteInput
		sum.Cost.Output += r.Cost.Output
	}
	// The rows come split by model as well, to be priced: one per name.
	var rows []accounting.CostRow
	index := map[string]int{}
	for _, r := range priced {
		i, ok := index[column.name(r.UsageRow)]
		if !ok {
			i = len(rows)
			index[column.name(r.UsageRow)] = i
			named := r
			named.Requests, named.Records, named.InputTokens, named.CachedTokens, named.OutputTokens = 0, 0, 0, 0, 0
			named.Cost = accounting.Cost{}
			rows = append(rows, named)
		}
		add(&rows[i], r)
	}
	total := func(r accounting.CostRow) int64 { return accounting.AddTokens(r.InputTokens, r.OutputTokens) }
	slices.SortFunc(rows, func(a, b accounting.CostRow) int {
		return cmp.Or(
			cmp.Compare(total(b), total(a)),
			cmp.Compare(column.name(a.UsageRow), column.name(b.UsageRow)),
		)
	})
	fmt.Fprintf(w, "Usage from %s to %s (UTC), by %s\n\n",
		q.Start.Format(time.DateTime), q.End.Format(time.DateTime), strings.ToLower(column.title))

	// Numbers align right; names are padded to one width so that they
	// still read left-aligned.
	width := len(column.title)
	for _, r := range rows {
		width = max(width, len(column.name(r.UsageRow)))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\tREQUESTS\tINPUT\tCACHED\tOUTPUT\tTOTAL\tCOST\t\n", width, column.title)
	requests := func(r accounting.CostRow) int64 {
		if column.allRecords {
			return r.Records
		}
		return r.Requests
	}
	var sum accounting.CostRow
	for _, r := range rows {
		fmt.Fprintf(tw, "%-*s\t%d\t%d\t%d\t%d\t%d\t%.6f\t\n", width, column.name(r.UsageRow),
			requests(r), r.InputTokens, r.CachedTokens, r.OutputTokens, total(r), r.Cost.Total())
		add(&sum, r)
	}
	fmt.Fprintf(tw, "%-*s\t%d\t%d\t%d\t%d\t%d\t%.6f\t\n", width, "TOTAL",
		requests(sum), sum.InputTokens, sum.CachedTokens, sum.OutputTokens, total(sum), sum.Cost.Total())
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("usage: write table: %w", err)
	}
	return nil
}
