"""Stale rollouts in RL with verifiable rewards: ranking certificates, staleness vs learning rate, Boltzmann projection

Modules:

- `stalebook.cli`: One console script, many subcommands. Each subcommand lives next to the code it drives and is imported only when called, so `stalebook --help` stays instant even though later subcommands load torch and transformers.
- `stalebook.core`: The four mechanisms every later module leans on. Each is small, pure where it can be, and specified exactly enough that a reader can recompute its outputs by hand.
- `stalebook.protocol`: The analysis layer every experiment point uses (DESIGN §2.5, §2.7; seed 000). Framework-neutral: numpy only. It takes per-rollout *sketched score vectors* $v_y\in\mathbb R^{d}$ and rewards, grouped by prompt and split, and returns split-half reliability, selection gains, their 10,000-replicate bootstrap bounds, the admissibility gate and the regime verdict.
- `stalebook.theory.reliability`: DESIGN §2.5–2.6, seed 000. In a Gaussian latent-score model the split-half reliability $\mathrm{Rel}_k$ identifies the signal-to-noise ratio $\rho$, and $\rho$ fixes how well *any* selector that is independent of the reference noise can agree with the noisy A/B reference: a ceiling on expected precision. Exact certification of the top-$k$ costs $m\asymp\sigma^2\Delta^{-2}\log(\cdot/\delta)$ samples. These are results under Gaussianity, equal noise variance and conditional independence — assumptions, not facts about real data (the seed says so explicitly)."""

__version__ = "0.0.1"
