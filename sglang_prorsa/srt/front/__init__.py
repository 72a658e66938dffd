"""The thin front: one address for generation that picks a pair (or an instance) and relays bytes."""
