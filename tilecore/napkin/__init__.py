"""The napkin: model diagrams, GPU memory levels and an IO performance model. Pure Python."""
