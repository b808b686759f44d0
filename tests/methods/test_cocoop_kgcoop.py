"""FedCoCoOp and FedKgCoOp against transcriptions of the originals' call sequence, on the tiny CLIP.

Transcribed (docs/sources/cocoop-kgcoop.md is the reading):
- KaiyangZhou/CoOp @ ff61507c790454bce7c5052c3ac39e60772f1f89, trainers/cocoop.py: `TextEncoder` L39-59,
  `PromptLearner.__init__` L62-121 (ctx from words L75-83; the Meta-Net L95-99; the class prompts L104-116),
  `construct_prompts` L123-142, `PromptLearner.forward` L144-161, `CustomCLIP.forward` L174-194 (the per-image loop).
- htyao89/KgCoOp @ c43ccc32c8739f64b165cfa205fcc6c0f5bb5b17, KgCoOp/trainers/kgcoop.py: `PromptLearner` L94-116 and
  L127-146 (ctx from "a photo of a"; the hand-crafted features, normalised), `PromptLearner.forward` L175-193,
  `CustomCLIP.forward` L223-243 (the score with CosineSimilarity(dim=1, eps=1e-7)), `forward_backward` L309-310
  (CE + W * score).
- 0-ml/flip @ ec3a848b46f3c7d0030052f0c8a4401767d8c09f: flcore/models/clip/CoCoOp.py L21-40 and KgCoOp.py L37-58 (the
  same forward and score, federated), flcore/utils.py L347-377 (ctx and every Meta-Net weight uploaded).

The text encoder is CoOp's on open_clip: open_clip's `Transformer` takes (N, L, D) and transposes itself where it is
not batch-first, so CoOp's NLD -> LND permute (written for OpenAI's LND transformer) is left out, and its causal mask
is passed as open_clip's `encode_text` passes it. The transcriptions tokenise the full context length (fedur cuts the
padding after the last EOT and computes the shared SOS + context prefix once: what these comparisons also cover).
"""

from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.labels import FPL
from fedur.labels.base import PseudoLabels
from fedur.methods import FedCoCoOp, FedKgCoOp, PromptFL
from fedur.methods.base import GlobalView, ServerRound
from fedur.methods.cocoop import META, META_NAMES
from fedur.methods.pieces import initial_values, piece_seed
from fedur.model.classifier import PromptedCLIP
from fedur.train.module import PromptTuner

NAMES = ["cat", "dog", "red_bird", "aircraft carrier"]  # names of 1-2 tokens (unequal prompt lengths), one with "_"
SEED = 3
WORDS = "a photo of a"  # CoCoOp's and KgCoOp's published ctx init (4 one-token words)
TEXTURE = "a photo of a {}, a type of texture."  # KgCoOp's CUSTOM_TEMPLATES["DescribableTextures"] (L41)


# --- the originals, transcribed -------------------------------------------------------------------------------------
class TextEncoder(nn.Module):
    """CoOp's TextEncoder (cocoop.py L39-59; kgcoop.py L59-79) over open_clip's CLIP."""

    def __init__(self, clip_model):
        super().__init__()
        self.transformer = clip_model.transformer
        self.positional_embedding = clip_model.positional_embedding
        self.ln_final = clip_model.ln_final
        self.text_projection = clip_model.text_projection
        self.attn_mask = clip_model.attn_mask  # OpenAI's ResidualAttentionBlock holds it; open_clip's takes it per call

    def forward(self, prompts, tokenized_prompts):
        x = prompts + self.positional_embedding
        x = self.transformer(x, attn_mask=self.attn_mask)  # open_clip: NLD in and out
        x = self.ln_final(x)
        # take features from the eot embedding (eot_token is the highest number in each sequence)
        return x[torch.arange(x.shape[0]), tokenized_prompts.argmax(dim=-1)] @ self.text_projection


class CoCoOpPromptLearner(nn.Module):
    """cocoop.py `PromptLearner` L62-161 (fp32: PREC "fp32", no `.half()`; the cfg's N_CTX / CTX_INIT as arguments)."""

    def __init__(self, clip, classnames, n_ctx, ctx_init=""):
        super().__init__()
        clip_model, tokenize = clip.model, clip.tokenizer
        n_cls = len(classnames)
        ctx_dim = clip_model.ln_final.weight.shape[0]
        vis_dim = clip_model.visual.output_dim
        if ctx_init:
            ctx_init = ctx_init.replace("_", " ")
            n_ctx = len(ctx_init.split(" "))
            prompt = tokenize([ctx_init])
            with torch.no_grad():
                embedding = clip_model.token_embedding(prompt)
            ctx_vectors = embedding[0, 1: 1 + n_ctx, :]
            prompt_prefix = ctx_init
        else:
            ctx_vectors = torch.empty(n_ctx, ctx_dim)
            nn.init.normal_(ctx_vectors, std=0.02)
            prompt_prefix = " ".join(["X"] * n_ctx)
        self.ctx = nn.Parameter(ctx_vectors)
        self.meta_net = nn.Sequential(OrderedDict([
            ("linear1", nn.Linear(vis_dim, vis_dim // 16)),
            ("relu", nn.ReLU(inplace=True)),
            ("linear2", nn.Linear(vis_dim // 16, ctx_dim))
        ]))
        classnames = [name.replace("_", " ") for name in classnames]
        prompts = [prompt_prefix + " " + name + "." for name in classnames]
        tokenized_prompts = tokenize(prompts)  # (n_cls, n_tkn): clip.tokenize per prompt, concatenated
        with torch.no_grad():
            embedding = clip_model.token_embedding(tokenized_prompts)
        self.register_buffer("token_prefix", embedding[:, :1, :])  # SOS
        self.register_buffer("token_suffix", embedding[:, 1 + n_ctx:, :])  # CLS, EOS
        self.n_cls, self.n_ctx, self.tokenized_prompts = n_cls, n_ctx, tokenized_prompts

    def construct_prompts(self, ctx, prefix, suffix):
        return torch.cat([prefix, ctx, suffix], dim=1)

    def forward(self, im_features):
        prefix, suffix = self.token_prefix, self.token_suffix
        ctx = self.ctx                     # (n_ctx, ctx_dim)
        bias = self.meta_net(im_features)  # (batch, ctx_dim)
        bias = bias.unsqueeze(1)           # (batch, 1, ctx_dim)
        ctx = ctx.unsqueeze(0)             # (1, n_ctx, ctx_dim)
        ctx_shifted = ctx + bias           # (batch, n_ctx, ctx_dim)
        prompts = []
        for ctx_shifted_i in ctx_shifted:
            ctx_i = ctx_shifted_i.unsqueeze(0).expand(self.n_cls, -1, -1)
            prompts.append(self.construct_prompts(ctx_i, prefix, suffix))  # (n_cls, n_tkn, ctx_dim)
        return torch.stack(prompts)


class CoCoOpCLIP(nn.Module):
    """cocoop.py `CustomCLIP` L164-194 (the logits; the CE of L191-192 is taken outside)."""

    def __init__(self, clip, classnames, n_ctx, ctx_init=""):
        super().__init__()
        self.prompt_learner = CoCoOpPromptLearner(clip, classnames, n_ctx, ctx_init)
        self.tokenized_prompts = self.prompt_learner.tokenized_prompts
        self.image_encoder = clip.model.visual
        self.text_encoder = TextEncoder(clip.model)
        self.logit_scale = clip.model.logit_scale

    def forward(self, image):
        tokenized_prompts = self.tokenized_prompts
        logit_scale = self.logit_scale.exp()
        image_features = self.image_encoder(image)
        image_features = image_features / image_features.norm(dim=-1, keepdim=True)
        prompts = self.prompt_learner(image_features)
        logits = []
        for pts_i, imf_i in zip(prompts, image_features):
            text_features = self.text_encoder(pts_i, tokenized_prompts)
            text_features = text_features / text_features.norm(dim=-1, keepdim=True)
            logits.append(logit_scale * imf_i @ text_features.t())
        return torch.stack(logits)

    def load_fedur(self, pieces):
        """fedur's pieces into the transcription (the names FLiP uploads, flcore/utils.py L347-377)."""
        with torch.no_grad():
            self.prompt_learner.ctx.copy_(pieces["text_ctx"])
            for name in META_NAMES:
                self.prompt_learner.meta_net.get_parameter(name).copy_(pieces[META + name])


def reference_cocoop(clip, n_ctx, ctx_init="", seed=None):
    """The original's model built under `torch.manual_seed(seed)` (None: the global RNG as it is), the RNG restored."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        return CoCoOpCLIP(clip, NAMES, n_ctx, ctx_init)


class KgCoOpCLIP(nn.Module):
    """kgcoop.py `PromptLearner` (generic context, class token at the end) and `CustomCLIP.forward` L223-243; the
    hand-crafted features `text_features_old` are handed in (L131-146: CLIP's encode_text of the template, normalised)."""

    def __init__(self, clip, classnames, ctx, text_features_old):
        super().__init__()
        clip_model = clip.model
        n_ctx = ctx.shape[0]
        self.ctx = nn.Parameter(ctx.clone())
        prompts = [" ".join(["X"] * n_ctx) + " " + name.replace("_", " ") + "." for name in classnames]
        self.tokenized_prompts = clip.tokenizer(prompts)
        with torch.no_grad():
            embedding = clip_model.token_embedding(self.tokenized_prompts)
        self.token_prefix, self.token_suffix = embedding[:, :1, :], embedding[:, 1 + n_ctx:, :]
        self.n_cls = len(classnames)
        self.ori_embedding = text_features_old
        self.image_encoder = clip_model.visual
        self.text_encoder = TextEncoder(clip_model)
        self.logit_scale = clip_model.logit_scale

    def prompt_learner(self):  # PromptLearner.forward L175-193
        ctx = self.ctx
        if ctx.dim() == 2:
            ctx = ctx.unsqueeze(0).expand(self.n_cls, -1, -1)
        return torch.cat([self.token_prefix, ctx, self.token_suffix], dim=1)

    def forward(self, image):
        prompts = self.prompt_learner()
        image_features = self.image_encoder(image)
        text_features = self.text_encoder(prompts, self.tokenized_prompts)
        text_features_old = self.ori_embedding
        image_features = image_features / image_features.norm(dim=-1, keepdim=True)
        text_features = text_features / text_features.norm(dim=-1, keepdim=True)
        logit_scale = self.logit_scale.exp()
        logits = logit_scale * image_features @ text_features.t()
        cos = torch.nn.CosineSimilarity(dim=1, eps=1e-07)
        text_features_old = text_features_old / text_features_old.norm(dim=-1, keepdim=True)
        score = cos(text_features, text_features_old)
        score = 1.0 - torch.mean(score)
        return logits, score


@torch.no_grad()
def hand_crafted(clip, template):
    """kgcoop.py L136-144: CLIP's normalised features of the template filled with each class name."""
    tokens = clip.tokenizer([template.format(c.replace("_", " ")) for c in NAMES])
    text_features = clip.model.encode_text(tokens)
    return text_features / text_features.norm(dim=-1, keepdim=True)


# --- helpers --------------------------------------------------------------------------------------------------------
def prompted(tiny_clip, n_ctx=2):
    return PromptedCLIP(tiny_clip, NAMES, n_ctx, 0, None, 0.02, seed=SEED)


def trainable(pieces):
    return {n: t.clone().requires_grad_() for n, t in pieces.items()}


def client_of(pieces, n=4):
    pseudo = PseudoLabels(torch.arange(n), torch.arange(n) % len(NAMES), torch.zeros(n, len(NAMES), dtype=torch.bool))
    return ClientState(0, np.arange(n), np.arange(0), dict(pieces), pseudo_labels=pseudo)


def images(n, seed=0):
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def meta_seed(method):
    pieces = method.pieces()
    return piece_seed(SEED, META + "linear1.weight", pieces[META + "linear1.weight"])


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


# --- FedCoCoOp --------------------------------------------------------------------------------------------------------
def test_cocoop_meta_net_pieces_are_the_originals_seeded_sequential(tiny_clip):
    """The four Meta-Net pieces are the weights of CoCoOp's `Sequential(linear1, relu, linear2)` (L95-99) built under
    torch.manual_seed(the pieces' seed): one seed for all four (one build), the RNG outside left as it was."""
    model = prompted(tiny_clip)
    method = FedCoCoOp()
    seeds = {piece_seed(SEED, n, p) for n, p in method.pieces().items() if n.startswith(META)}
    # Salt 5 (the reading's sec. 3.1: 1-3 are fedur's prompts', 4 FedTPG's): another would change every run's start.
    assert seeds == {SEED * 1000 + 5} and seeds != {piece_seed(SEED, "text_ctx", method.pieces()["text_ctx"])}
    before = torch.random.get_rng_state()
    pieces = initial_values(method.pieces(), model, SEED)
    assert torch.equal(torch.random.get_rng_state(), before)  # drawn from a forked RNG: no other draw moves

    D, width = tiny_clip.model.visual.output_dim, tiny_clip.model.ln_final.weight.shape[0]
    torch.manual_seed(meta_seed(method))
    net = nn.Sequential(OrderedDict([("linear1", nn.Linear(D, D // 16)), ("relu", nn.ReLU(inplace=True)),
                                     ("linear2", nn.Linear(D // 16, width))]))
    torch.random.set_rng_state(before)
    assert list(pieces) == ["text_ctx", *(META + n for n in META_NAMES)]
    for name, value in net.state_dict().items():
        assert torch.equal(pieces[META + name], value), name

    # With words, the original draws nothing before the Meta-Net: its whole PromptLearner under the seed is fedur's.
    model4 = prompted(tiny_clip, n_ctx=4)
    words = initial_values(FedCoCoOp(ctx_init=WORDS).pieces(), model4, SEED)
    learner = reference_cocoop(tiny_clip, 4, WORDS, seed=meta_seed(method)).prompt_learner
    assert torch.equal(words["text_ctx"], learner.ctx.detach())
    for name, value in learner.meta_net.state_dict().items():
        assert torch.equal(words[META + name], value), name


@pytest.mark.parametrize("chunk", [1, 2, 3, 32])
def test_cocoop_logits_and_gradients_are_the_originals_per_image_loop(tiny_clip, chunk):
    """FedCoCoOp's logits are CoCoOp's `CustomCLIP.forward` (one text pass per image, each image against its own
    class features, bias on every context vector), at every image_chunk, and so are the gradients of every piece."""
    model = prompted(tiny_clip, n_ctx=2)
    method = FedCoCoOp(image_chunk=chunk)
    start = initial_values(method.pieces(), model, SEED)
    # Move the pieces off their init, so that the Meta-Net's bias and the context both matter.
    pieces = trainable({n: t + 0.05 * torch.randn(t.shape, generator=torch.Generator().manual_seed(i))
                        for i, (n, t) in enumerate(start.items())})
    reference = reference_cocoop(tiny_clip, 2)
    reference.load_fedur(pieces)
    x = images(5)

    passes = []  # the text tower's passes: one per chunk of images, each over that chunk's contexts (the memory bound)
    encode = model.text_features
    model.text_features = lambda ctx: passes.append(ctx.shape[0]) or encode(ctx)
    try:
        ours = method.logits(model, x, pieces, method.text_side(model, pieces), client_of(pieces))
    finally:
        del model.text_features
    assert passes == [len(part) for part in torch.arange(5).split(chunk)]
    theirs = reference(x)
    assert ours.shape == (5, len(NAMES))
    close(ours, theirs)
    # Each image only against its own class features: another image's bias changes nothing of the others' rows.
    close(method.logits(model, x[2:3], pieces, None, client_of(pieces)), theirs[2:3])

    weights = torch.randn(theirs.shape, generator=torch.Generator().manual_seed(9))
    (ours * weights).sum().backward()
    (theirs * weights).sum().backward()
    learner = reference.prompt_learner
    close(pieces["text_ctx"].grad, learner.ctx.grad)
    for name in META_NAMES:
        close(pieces[META + name].grad, learner.meta_net.get_parameter(name).grad)


def test_cocoop_from_words_starts_from_clips_embeddings_and_gives_the_originals_logits(tiny_clip):
    """ctx_init "a photo of a" with model.n_ctx 4: the context is CLIP's `embedding[0, 1:1+n_ctx]` of the words
    (L75-83), and the logits are the original's, whose class prompts read "a photo of a <name>." (fedur's "X X X X
    <name>." differs only at the context's positions, which the context replaces)."""
    model = prompted(tiny_clip, n_ctx=4)
    method = FedCoCoOp(ctx_init=WORDS, image_chunk=2)
    pieces = initial_values(method.pieces(), model, SEED)
    with torch.no_grad():
        embedding = tiny_clip.model.token_embedding(tiny_clip.tokenizer([WORDS]))
    assert torch.equal(pieces["text_ctx"], embedding[0, 1:1 + 4])
    reference = reference_cocoop(tiny_clip, 4, WORDS, seed=meta_seed(method))
    assert reference.prompt_learner.n_ctx == 4
    x = images(3, seed=1)
    with torch.no_grad():
        close(method.logits(model, x, pieces, None, client_of(pieces)), reference(x))


@pytest.mark.parametrize("words", ["a photo", "photo"])
def test_cocoop_words_with_too_few_tokens_for_the_context_are_refused(tiny_clip, words):
    model = prompted(tiny_clip, n_ctx=4)
    with pytest.raises(ConfigError, match="fewer than model.n_ctx"):
        initial_values(FedCoCoOp(ctx_init=words).pieces(), model, SEED)


def test_cocoop_words_with_more_tokens_start_from_their_first_n_ctx(tiny_clip):
    """More words than model.n_ctx: fedur keeps the first n_ctx tokens' embeddings (the original would instead make
    n_ctx the number of words, L78: fedur's model fixes n_ctx, so the run's setting wins)."""
    model = prompted(tiny_clip, n_ctx=2)
    pieces = initial_values(FedCoCoOp(ctx_init=WORDS).pieces(), model, SEED)
    with torch.no_grad():
        embedding = tiny_clip.model.token_embedding(tiny_clip.tokenizer([WORDS]))
    assert torch.equal(pieces["text_ctx"], embedding[0, 1:3])


def test_cocoop_a_backbone_narrower_than_16_has_no_meta_net(tiny_clip):
    """D // 16 hidden units: with D < 16 there would be none, which is refused (not a Linear(D, 0))."""
    model = prompted(tiny_clip)
    model.feature_dim = 8  # a narrower joint embedding than the tiny CLIP's 64
    with pytest.raises(ConfigError, match="D / 16"):
        initial_values(FedCoCoOp().pieces(), model, SEED)


def test_cocoop_shares_everything_so_the_global_model_is_every_clients_after_download(tiny_clip):
    """FLiP uploads the context and every Meta-Net weight (flcore/utils.py L347-377) and averages them; nothing is
    personal, so the server's model is what every client holds after the download."""
    model = prompted(tiny_clip)
    method = FedCoCoOp()
    assert all(piece.shared and piece.trains for piece in method.pieces().values())
    start = initial_values(method.pieces(), model, SEED)
    a = {n: t + 1.0 for n, t in start.items()}
    b = {n: t - 3.0 for n, t in start.items()}
    client_a, client_b = client_of(a), client_of(b)
    uploads = [method.upload(c, None, None) for c in (client_a, client_b)]
    assert all(set(u) == set(start) for u in uploads)
    round_ = ServerRound(1, 1, {n: torch.stack([u[n] for u in uploads]) for n in start}, torch.tensor([1.0, 3.0]),
                         start, {})
    shared = method.aggregate(round_).shared
    for name in start:  # weighted by the clients' weights (the preset's: local data size)
        close(shared[name], start[name] - 2.0)
    view = GlobalView(shared, {}, start, lambda name: pytest.fail(f"no personal piece to average: {name}"))
    server = method.global_model(model, view)
    stale = client_of(start)  # a client that sat the round out
    method.download(stale, shared, {})
    x = images(3)
    with torch.no_grad():
        assert all(torch.equal(server.pieces[n], stale.pieces[n]) for n in start) and server.text is None
        assert torch.equal(method.logits(model, x, server.pieces, None, stale), method.logits(model, x, stale.pieces, None, stale))


@pytest.mark.parametrize("group", [1, 2], ids=["alone", "grouped"])
def test_cocoop_training_step_loss_is_the_originals_cross_entropy(tiny_clip, group):
    """A training step's loss is CoCoOp's `F.cross_entropy(logits, label)` (L191-192) and nothing else, a client
    alone and two in one step."""
    model = prompted(tiny_clip)
    method = FedCoCoOp(image_chunk=2)
    tuner = PromptTuner(model, method, FPL())
    start = initial_values(method.pieces(), model, SEED)
    pieces = [trainable({n: t + 0.01 * k for n, t in start.items()}) for k in range(group)]
    batches = [(images(3, seed=k), torch.tensor([0, 3, 1]), torch.zeros(3, len(NAMES), dtype=torch.bool), torch.arange(3))
               for k in range(group)]
    model.train()
    try:
        outs = tuner.training_step(batches, pieces, [client_of(p) for p in pieces])
    finally:
        model.eval()
    for out, p, (x, labels, _, _) in zip(outs, pieces, batches):
        reference = reference_cocoop(tiny_clip, 2)
        reference.load_fedur(p)
        close(out["loss"], F.cross_entropy(reference(x), labels))


# --- FedKgCoOp --------------------------------------------------------------------------------------------------------
def kgcoop_reference(tiny_clip, ctx, anchor):
    return KgCoOpCLIP(tiny_clip, NAMES, ctx.detach(), anchor)


@pytest.mark.parametrize("w", [8.0, 1.0])
@pytest.mark.parametrize("template", [None, TEXTURE], ids=["zero-shot", "own"])
def test_kgcoop_penalty_is_w_times_the_originals_score_and_trains_the_context(tiny_clip, w, template):
    """penalty = w * (1 - mean_c cos(t_c, t0_c)) with CosineSimilarity(dim=1, eps=1e-7) (L238-241, L310), t0 CLIP's
    normalised features of the hand-crafted prompt: the run's zero-shot features (template None) or the template's
    own (names' "_" as spaces, L137); its gradient on the context is the original's."""
    model = prompted(tiny_clip)
    model.zero_shot_text = hand_crafted(tiny_clip, "a photo of a {}.")  # what the round loop sets (setup.py)
    anchor = hand_crafted(tiny_clip, TEXTURE if template else "a photo of a {}.")
    method = FedKgCoOp(w=w, template=template)
    start = initial_values(method.pieces(), model, SEED)
    pieces = trainable({"text_ctx": start["text_ctx"] + 0.05})
    close(method.anchor(model, torch.device("cpu")), anchor)

    text = method.text_side(model, pieces)
    ours = method.penalty(model, pieces, start, client_of(start), text)
    reference = kgcoop_reference(tiny_clip, pieces["text_ctx"], anchor)
    logits, score = reference(images(4))
    theirs = w * score
    assert 0.01 < float(score.detach()) < 1.99  # a score the test can see (neither t = t0 nor t = -t0)
    close(ours, theirs)
    close(method.logits(model, images(4), pieces, text, client_of(start)), logits)  # CoOp's logits: PromptFL's

    ours.backward()
    theirs.backward()
    assert float(pieces["text_ctx"].grad.abs().sum()) > 0
    close(pieces["text_ctx"].grad, reference.ctx.grad)


def test_kgcoop_the_zero_shot_anchor_is_the_models_and_the_template_encodes_the_classes_it_holds(tiny_clip):
    """template None reads model.zero_shot_text at call time (another dataset's model, `for_classes`, brings its
    own); a template is encoded over the model's own class names."""
    model = prompted(tiny_clip)
    method = FedKgCoOp()
    model.zero_shot_text = torch.eye(len(NAMES), 64)
    assert torch.equal(method.anchor(model, torch.device("cpu")), torch.eye(len(NAMES), 64))
    other = model.for_classes(["ship", "truck"], "a photo of a {}.")
    assert method.anchor(other, torch.device("cpu")).shape == (2, 64)
    own = FedKgCoOp(template=TEXTURE).anchor(other, torch.device("cpu"))
    tokens = tiny_clip.tokenizer([TEXTURE.format(c) for c in ["ship", "truck"]])
    close(own, F.normalize(tiny_clip.model.encode_text(tokens), dim=-1).detach())


def test_kgcoop_w_zero_is_promptfl(tiny_clip):
    model = prompted(tiny_clip)
    model.zero_shot_text = hand_crafted(tiny_clip, "a photo of a {}.")
    method = FedKgCoOp(w=0.0)
    pieces = initial_values(method.pieces(), model, SEED)
    text = method.text_side(model, pieces)
    assert method.penalty(model, pieces, pieces, client_of(pieces), text) is None
    assert set(method.pieces()) == set(PromptFL().pieces()) == {"text_ctx"} and method.pieces()["text_ctx"].shared


@pytest.mark.parametrize("template", ["a photo of a cat.", "a {} of a {}.", "a photo of a {0}."])
def test_kgcoop_a_template_without_exactly_one_placeholder_is_refused(template):
    with pytest.raises(ConfigError, match="one {}"):
        FedKgCoOp(template=template)


def test_kgcoop_from_words_is_the_originals_start(tiny_clip):
    """KgCoOp's ctx with CTX_INIT set: the embeddings of "a photo of a" (L94-103, whatever words the cfg names)."""
    model = prompted(tiny_clip, n_ctx=4)
    pieces = initial_values(FedKgCoOp(ctx_init=WORDS).pieces(), model, SEED)
    with torch.no_grad():
        embedding = tiny_clip.model.token_embedding(tiny_clip.tokenizer(["a photo of a"]))
    assert torch.equal(pieces["text_ctx"], embedding[0, 1:1 + 4])


@pytest.mark.parametrize("group", [1, 2], ids=["alone", "grouped"])
@pytest.mark.parametrize("template", [None, TEXTURE], ids=["zero-shot", "own"])
def test_kgcoop_training_step_loss_is_cross_entropy_plus_w_score(tiny_clip, template, group):
    """A training step's loss is `F.cross_entropy(output, label) + self.w * score` (forward_backward L309-310), a
    client alone and two in one step (whose contexts go through the text tower together)."""
    model = prompted(tiny_clip)
    model.zero_shot_text = hand_crafted(tiny_clip, "a photo of a {}.")
    anchor = hand_crafted(tiny_clip, TEXTURE if template else "a photo of a {}.")
    method = FedKgCoOp(w=8.0, template=template)
    tuner = PromptTuner(model, method, FPL())
    start = initial_values(method.pieces(), model, SEED)
    pieces = [trainable({"text_ctx": start["text_ctx"] + 0.03 * (k + 1)}) for k in range(group)]
    batches = [(images(4, seed=k), torch.tensor([1, 0, 3, 2]), torch.zeros(4, len(NAMES), dtype=torch.bool), torch.arange(4))
               for k in range(group)]
    model.train()
    try:
        outs = tuner.training_step(batches, pieces, [client_of(start) for _ in pieces])
    finally:
        model.eval()
    for out, p, (x, labels, _, _) in zip(outs, pieces, batches):
        output, score = kgcoop_reference(tiny_clip, p["text_ctx"], anchor)(x)
        close(out["loss"], F.cross_entropy(output, labels) + 8.0 * score)
        assert float(score.detach()) > 1e-3  # the knowledge term is in the loss, not vanishing
