"""Runnable examples of celery-singleton-lock; each folder's README.md has its one command."""
