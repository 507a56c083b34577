"""What every layer shares and nothing above it: files written safely (`files`)."""
