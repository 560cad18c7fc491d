"""The `rlotel` command (`commands.main`); `python -m rlotel.cli` runs it too."""
