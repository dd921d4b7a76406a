"""Fakes shared by the tests: stand-ins at the process boundary (a fake OpenAI server) and the constant-score mutant."""
