"""Tests for beam_agents.model."""
