"""Stale rollouts in RL with verifiable rewards: ranking certificates, staleness vs learning rate, Boltzmann projection

Modules:

- `stalebook.cli`: One console script, many subcommands. Each subcommand lives next to the code it drives and is imported only when called, so `stalebook --help` stays instant even though later subcommands load torch and transformers.
- `stalebook.core`: The four mechanisms every later module leans on. Each is small, pure where it can be, and specified exactly enough that a reader can recompute its outputs by hand.
- `stalebook.model`: A real Hugging Face snapshot on a laptop: character tokenizer, a ~0.5M-parameter Llama, SFT warm start into the RL band, peft LoRA adapters and a content hash that names a policy exactly.
- `stalebook.preflight`: Before any GPU work a run proves it has exactly the snapshot it was registered with, cannot reach the network, cannot pick up credentials, and has a verifier that still tells right from wrong.
- `stalebook.protocol`: The analysis layer every experiment point uses (DESIGN §2.5, §2.7; seed 000). Framework-neutral: numpy only. It takes per-rollout *sketched score vectors* v_y (d-dimensional) and rewards, grouped by prompt and split, and returns split-half reliability, selection gains, their 10,000-replicate bootstrap bounds, the admissibility gate and the regime verdict.
- `stalebook.sandbox`: A code reward executes text that a policy wrote. This module runs it in a separate, resource-limited, network-less, killable process and lets the **parent** decide the reward.
- `stalebook.tasks`: A *task* is a prompt plus what it takes to check a completion; a *verifier* maps (task, completion) to a reward in {0, 1}. Two domains: math (numeric answers) and code (programs run against tests in the sandbox of `21_sandbox`).
- `stalebook.theory.async_sim`: Many prompts with shared-feature softmax policies, GRPO updates from a behaviour snapshot synced every S learner steps, a collapse criterion fixed in advance, and the S x eta sweeps that test seed 001.
- `stalebook.theory.boltzmann`: The KL-regularised RLVR optimum as a Boltzmann tilt of the reference; which weighted SFT reaches it (BOLT), what finite one-shot data cannot recover (the support gap), the temperature–coverage–variance trade-off, and iterative BOLT as KL policy mirror descent (seed 002, DESIGN §2.9).
- `stalebook.theory.estimators`: g_ab = E_beta[ sum_t P_t^a r_t S_t^b z_t R ]: one log-space implementation for exact enumeration, sampled rollouts and (later) LoRA gradients of a real model.
- `stalebook.theory.margin`: If the top-k margin of the true scores exceeds twice the uniform score error, the estimated top-k set is the true one, with a guaranteed separation; the bound is tight.
- `stalebook.theory.nonident`: A selection rule that observes only the history-corrected g_10, or only the action-value-corrected g_01, cannot recover the on-policy top-k: two pools with identical observation laws and different true top-k sets, with tiny KL, unit ESS and GRPO normalisation.
- `stalebook.theory.reliability`: DESIGN §2.5–2.6, seed 000. In a Gaussian latent-score model the split-half reliability Rel_k identifies the signal-to-noise ratio ρ, and ρ fixes how well *any* selector that is independent of the reference noise can agree with the noisy A/B reference: a ceiling on expected precision. Exact certification of the top-k costs m ≍ σ²Δ⁻² log(·/δ) samples. These are results under Gaussianity, equal noise variance and conditional independence — assumptions, not facts about real data (the seed says so explicitly).
- `stalebook.theory.staleness`: The behaviour-aware GRPO surrogate L(theta; phi), its gradient map H(theta, phi) exactly and from K-groups, the decomposition g = H_on + xi + delta, and seed 001's two-constraint stability rule.
- `stalebook.theory.tree`: Tabular softmax policies over a vocabulary of V tokens and horizon T, with every response enumerated: the laboratory in which every identity of the theory is checked exactly."""

__version__ = "0.0.1"
