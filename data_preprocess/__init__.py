"""Offline preprocessing: raw text -> token files (.bin/.idx) and sample indices (.ibin)."""
