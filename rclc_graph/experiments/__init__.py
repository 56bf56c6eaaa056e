"""Experiments: datasets, arms, scoring, tables and plots comparing handoff policies."""
