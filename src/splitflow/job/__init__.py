"""The main job's parts: the event-file producer, the streaming pipeline, the live view.

``python -m splitflow demo`` runs them together (:mod:`splitflow.demo`).
"""
