"""Softmax family on x86 (placeholder while the template is being written)."""

from __future__ import annotations
