"""The pipeline's stages, one package each: crawler, filter, classifier, builder, evaluator."""
