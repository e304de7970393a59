"""Contracts shared by every component: defined once here, imported everywhere else."""
