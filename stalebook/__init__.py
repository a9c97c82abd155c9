"""Stale rollouts in RL with verifiable rewards: ranking certificates, staleness vs learning rate, Boltzmann projection

Modules:

- `stalebook.cli`: One console script, many subcommands. Each subcommand lives next to the code it drives and is imported only when called, so `stalebook --help` stays instant even though later subcommands load torch and transformers.
- `stalebook.core`: The four mechanisms every later module leans on. Each is small, pure where it can be, and specified exactly enough that a reader can recompute its outputs by hand.
- `stalebook.theory.async_sim`: Many prompts with shared-feature softmax policies, GRPO updates from a behaviour snapshot synced every S learner steps, a collapse criterion fixed in advance, and the S x eta sweeps that test seed 001.
- `stalebook.theory.staleness`: The behaviour-aware GRPO surrogate L(theta; phi), its gradient map H(theta, phi) exactly and from K-groups, the decomposition g = H_on + xi + delta, and seed 001's two-constraint stability rule.
- `stalebook.theory.tree`: Tabular softmax policies over a vocabulary of V tokens and horizon T, with every response enumerated: the laboratory in which every identity of the theory is checked exactly."""

__version__ = "0.0.1"
