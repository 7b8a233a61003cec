package admin

import (
	"math"
	"reflect"
	"testing"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
)

func TestBudgetsOf(t *testing.T) {
	rows := []accounting.SpentRow{
		{Subject: accounting.Subject{Team: "acme", Project: "chat", Key: "k1"}, Tokens: 10},
		{Subject: accounting.Subject{Team: "acme", Project: "eval", Key: "k1"}, Tokens: 20},
		{Subject: accounting.Subject{Team: "acme", Project: "chat", Key: "k2"}, Tokens: 5},
		{Subject: accounting.Subject{Team: "globex", Project: "chat", Key: "k3"}, Tokens: 7},
	}
	tests := []struct {
		name  string
		limit config.Limit
		want  []budgetJSON
	}{
		{"every team together", config.Limit{}, []budgetJSON{{Used: 42}}},
		{"one team", config.Limit{Team: "acme"}, []budgetJSON{{Team: "acme", Used: 35}}},
		{"each team", config.Limit{Team: "*"}, []budgetJSON{{Team: "acme", Used: 35}, {Team: "globex", Used: 7}}},
		{"each project of one team", config.Limit{Team: "acme", Project: "*"},
			[]budgetJSON{{Team: "acme", Project: "chat", Used: 15}, {Team: "acme", Project: "eval", Used: 20}}},
		{"one key", config.Limit{Key: "k1"}, []budgetJSON{{Key: "k1", Used: 30}}},
		{"a team with no spend yet", config.Limit{Team: "initech"}, []budgetJSON{{Team: "initech", Used: 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := budgetsOf(tt.limit, rows); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("budgetsOf = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestBudgetsOfSaturates sums spend rows as large as a store may return
// for records a backend over-reported: the sum saturates at 2^63-1 instead
// of wrapping negative, and a negative row (from a store that does not
// clamp) takes nothing off.
func TestBudgetsOfSaturates(t *testing.T) {
	rows := []accounting.SpentRow{
		{Subject: accounting.Subject{Team: "acme", Project: "a"}, Tokens: math.MaxInt64},
		{Subject: accounting.Subject{Team: "acme", Project: "b"}, Tokens: 1 << 62},
		{Subject: accounting.Subject{Team: "acme", Project: "c"}, Tokens: 1 << 62},
		{Subject: accounting.Subject{Team: "globex", Project: "a"}, Tokens: -500},
		{Subject: accounting.Subject{Team: "globex", Project: "b"}, Tokens: 30},
	}
	got := budgetsOf(config.Limit{Team: "*"}, rows)
	want := []budgetJSON{{Team: "acme", Used: math.MaxInt64}, {Team: "globex", Used: 30}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("budgetsOf = %+v, want %+v", got, want)
	}
}
