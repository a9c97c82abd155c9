"""Stale rollouts in RL with verifiable rewards: ranking certificates, staleness vs learning rate, Boltzmann projection

Modules:

- `stalebook.cli`: One console script, many subcommands. Each subcommand lives next to the code it drives and is imported only when called, so `stalebook --help` stays instant even though later subcommands load torch and transformers.
- `stalebook.core`: The four mechanisms every later module leans on. Each is small, pure where it can be, and specified exactly enough that a reader can recompute its outputs by hand.
- `stalebook.model`: A real Hugging Face snapshot on a laptop: character tokenizer, a ~0.5M-parameter Llama, SFT warm start into the RL band, peft LoRA adapters and a content hash that names a policy exactly.
- `stalebook.preflight`: Before any GPU work a run proves it has exactly the snapshot it was registered with, cannot reach the network, cannot pick up credentials, and has a verifier that still tells right from wrong.
- `stalebook.sandbox`: A code reward executes text that a policy wrote. This module runs it in a separate, resource-limited, network-less, killable process and lets the **parent** decide the reward.
- `stalebook.tasks`: A *task* is a prompt plus what it takes to check a completion; a *verifier* maps (task, completion) to a reward in {0, 1}. Two domains: math (numeric answers) and code (programs run against tests in the sandbox of `21_sandbox`)."""

__version__ = "0.0.1"
