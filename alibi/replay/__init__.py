"""Turning layer differences into tokens: teacher-forced replay, greedy agreement, prefill vs decode."""
