"""The crash-point explorer (issue 31, item 5): docs/crash-explorer.md."""
