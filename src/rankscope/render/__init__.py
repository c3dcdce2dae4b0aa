"""One module per output format. Renderers format results; they never compute."""
