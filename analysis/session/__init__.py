"""What a visit to the explorer holds: models, images, traces, selections, caches, files, input checks."""
