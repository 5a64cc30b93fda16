package history

import (
	"strings"
	"testing"
	"time"
)

func op(kind Kind, key string, inv, comp int, out Outcome, res, sres string) Op {
	return Op{Kind: kind, Key: key, Attempt: 1, Invoke: time.Duration(inv), Complete: time.Duration(comp), Outcome: out, Result: res, StatusResult: sres}
}

func task(kind Kind, key string, inv, comp int, id, res, sres string) Op {
	o := op(kind, key, inv, comp, Ok, res, sres)
	o.Task = id
	return o
}

func kinds(as []Anomaly) string {
	var ks []string
	for _, a := range as {
		ks = append(ks, a.Kind)
	}
	return strings.Join(ks, ",")
}

func TestCheck(t *testing.T) {
	clean := World{Executions: map[string][]string{"a": {"1"}}, Effects: []Effect{{"a", 1, "u-1"}, {"a", 2, "u-2"}}, Receipts: []string{"u-1", "u-2"}}
	for _, c := range []struct {
		name string
		ops  []Op
		w    World
		want string
	}{
		{"Clean", []Op{
			op(Status, "a", 0, 1, Ok, "not_found", ""),
			op(Call, "a", 2, 5, Info, "", "timeout"),
			op(Status, "a", 3, 4, Ok, "in_flight", ""),
			op(Call, "a", 6, 8, Ok, "1", ""),
			op(Status, "a", 9, 10, Ok, "completed", "1"),
		}, clean, ""},
		{"ConcurrentReadMaySeeEither", []Op{
			op(Call, "a", 0, 10, Ok, "1", ""),
			op(Status, "a", 1, 2, Ok, "completed", "1"),
			op(Status, "a", 3, 4, Ok, "in_flight", ""),
		}, clean, "nonlinearizable"},
		{"StaleReadAfterAnswer", []Op{
			op(Call, "a", 0, 1, Ok, "1", ""),
			op(Status, "a", 2, 3, Ok, "not_found", ""),
		}, clean, "nonlinearizable"},
		{"Duplicate", []Op{op(Call, "a", 0, 1, Ok, "1", "")},
			World{Executions: map[string][]string{"a": {"1", "2"}}}, "duplicate"},
		{"WrongResult", []Op{op(Call, "a", 0, 1, Ok, "2", "")}, World{Executions: map[string][]string{"a": {"1"}}}, "wrong_result"},
		{"Lost", []Op{op(Call, "a", 0, 1, Ok, "1", "")}, World{}, "lost"},
		{"UnknownOnlyWhenForwarded", []Op{op(Status, "a", 0, 1, Ok, "unknown", "")}, World{}, "unknown_state"},
		{"Undelivered", nil, World{Effects: []Effect{{"a", 1, "u-1"}}}, "undelivered"},
		{"Redelivered", nil, World{Effects: []Effect{{"a", 1, "u-1"}}, Receipts: []string{"u-1", "u-1"}}, "redelivered"},
		{"TaskClean", []Op{
			task(TaskCall, "a", 0, 1, "t1", "", ""),
			task(TaskPoll, "a", 2, 3, "t1", "working", ""),
			op(Status, "a", 4, 5, Ok, "in_flight", ""),
			task(TaskPoll, "a", 6, 7, "t1", "completed", "1"),
			op(Status, "a", 8, 9, Ok, "completed", "1"),
			task(TaskCall, "a", 10, 11, "t1", "", ""),
		}, clean, ""},
		{"TaskFailedWithoutExecution", []Op{
			task(TaskCall, "b", 0, 1, "t2", "", ""),
			task(TaskPoll, "b", 2, 3, "t2", "failed", ""),
			op(Status, "b", 4, 5, Ok, "failed", ""),
		}, World{}, ""},
		{"TwoTasksForOneKey", []Op{
			task(TaskCall, "a", 0, 1, "t1", "", ""),
			task(TaskCall, "a", 2, 3, "t2", "", ""),
		}, clean, "two_tasks"},
		{"TaskStatusGoesBack", []Op{
			task(TaskPoll, "a", 0, 1, "t1", "completed", "1"),
			task(TaskPoll, "a", 2, 3, "t1", "working", ""),
		}, clean, "task_regressed,nonlinearizable"},
		{"TaskWrongResult", []Op{task(TaskPoll, "a", 0, 1, "t1", "completed", "2")}, clean, "wrong_result"},
		{"TaskFailedButExecuted", []Op{task(TaskPoll, "a", 0, 1, "t1", "failed", "")}, clean, "wrong_result"},
		{"TaskLost", []Op{task(TaskCall, "a", 0, 1, "t1", "", ""), task(TaskPoll, "a", 2, 3, "t1", "not_found", "")}, clean, "task_lost"},
		{"Reordered", nil, World{Effects: []Effect{{"a", 1, "u-1"}, {"a", 2, "u-2"}}, Receipts: []string{"u-2", "u-1"}}, "reordered"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := kinds(Check(c.ops, c.w, 10*time.Second))
			if got != c.want {
				t.Fatalf("anomalies %q, want %q", got, c.want)
			}
		})
	}
}
