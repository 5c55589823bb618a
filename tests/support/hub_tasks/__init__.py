"""Fixture mirrors of MIEB tasks' hub repos, each in its repo's layout: {task name: write(root)} per module."""
