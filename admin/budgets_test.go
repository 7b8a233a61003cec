package admin

import (
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
