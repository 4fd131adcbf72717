"""Every field with its default. Experiment configs start from get_base_config() and change what
differs; overrides come from the command line as --config.section.field=value."""

import ml_collections


def get_base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0                      # seeds parameters, batches and dropout
  for add_section in (_add_parallel, _add_task, _add_model, _add_train):
    add_section(config)
  return config


def _add_parallel(config: ml_collections.ConfigDict) -> None:
  """config.parallel: how a run is placed on devices."""
  config.parallel = ml_collections.ConfigDict()
  config.parallel.mode = 'pmap'        # 'pmap' (parameters replicated, gradients psum-ed) or 'mesh' (one jit program
  #                                      over a data x fsdp x tensor device mesh, NamedSharding, XLA's collectives)
  config.parallel.fsdp = 1             # mesh: devices over which parameters and optimizer state are split; -1: all
  config.parallel.tensor = 1           # mesh: devices over which heads and feed-forward units are split (Megatron)
  config.parallel.rules = ml_collections.ConfigDict()  # where each logical parameter axis is split; '': nowhere
  config.parallel.rules.embed = 'fsdp'   # model width: every matrix and the embedding have one
  config.parallel.rules.heads = 'tensor'  # the query heads (query and output projections)
  config.parallel.rules.kv_heads = 'tensor'  # the key and value heads (key and value projections)
  config.parallel.rules.mlp = 'tensor'   # feed-forward hidden units
  config.parallel.rules.vocab = ''       # vocabulary rows of the embedding and output matrices


def _add_task(config: ml_collections.ConfigDict) -> None:
  """config.task: what the model learns and is evaluated on."""
  config.task = ml_collections.ConfigDict()
  config.task.name = 'copy'            # see experiments/tasks: copy, reverse, ..., shakespeare, forecast
  config.task.model_kind = 'decoder_only'  # decoder_only, encoder_decoder or encoder_only (forecast)
  config.task.vocab_size = 16          # symbols the task draws from (specials are added on top)
  config.task.min_length = 1           # shortest training sequence (before specials)
  config.task.max_length = 16          # longest training sequence; the "training length" L
  config.task.eval_lengths = (8, 16, 32, 64)  # lengths evaluated at the end (and every eval_every)
  config.task.eval_batches = 2         # batches per evaluation length
  config.task.dataset = ''             # forecast: the series, sunspots, co2 or stocks
  config.task.horizon = 1              # forecast: steps predicted at once
  config.task.patch_length = 1         # forecast: values per input token (patches, as PatchTST); lengths are multiples
  config.task.path = ''                # corpus: a folder that experiments.prepare_corpus wrote
  config.task.packing = 'stream'       # corpus: 'stream' (windows across documents)
  config.task.passkey_fraction = 0.0   # shakespeare, corpus: the share of training rows that are passkey prompts
  config.task.needle_fraction = 0.0    # shakespeare, corpus: the share that are prompts of several needles
  config.task.needles = 4              # the needles in each of those, one asked for


def _add_model(config: ml_collections.ConfigDict) -> None:
  """config.model and config.model.position: the architecture and its positional encoding."""
  config.model = ml_collections.ConfigDict()
  config.model.architecture = 'transformer'  # 'transformer', or the baselines 'lstm', 'rnn'
  config.model.vocab_size = 0          # 0: the task's vocabulary; more: extra output rows beyond it (a pretrained
  #                                      model's padded vocabulary, to fine-tune it with train.init_from)
  config.model.model_dim = 64          # d_model
  config.model.num_heads = 4           # heads; model_dim must be a multiple
  config.model.head_width = 0          # each attention head's width; 0: model_dim / num_heads (Gemma 3: wider)
  config.model.num_kv_heads = 0        # key and value heads (grouped-query attention), a divisor of num_heads;
  #                                      1: multi-query; 0: num_heads (multi-head)
  config.model.feed_forward_dim = 256  # d_ff
  config.model.num_encoder_layers = 2  # encoder layers (encoder_decoder, encoder_only)
  config.model.num_decoder_layers = 2  # decoder layers (decoder_only, encoder_decoder)
  config.model.dropout_rate = 0.0      # residual, embedding and feed-forward dropout
  config.model.attention_dropout_rate = 0.0  # dropout on attention weights
  config.model.activation = 'relu'     # 'relu' (the paper), 'gelu' (tanh), 'gelu_exact', or gated: 'swiglu', 'geglu'
  config.model.norm = 'pre'            # 'post' (the paper), 'pre' or 'output' (x + LN(F(x)), OLMo 2)
  config.model.norm_type = 'layernorm'  # 'layernorm' (the paper) or 'rmsnorm' (Llama)
  config.model.layer_norm_eps = 1e-6   # the norm's epsilon (Llama 1 1e-6; Llama 2 and SmolLM2 1e-5)
  config.model.use_bias = True         # biases on every projection and the feed-forward (Llama: False)
  config.model.qkv_bias = False        # query, key and value biases even without use_bias (Qwen2)
  config.model.attention_output_bias = False  # attention's output bias even without use_bias (Llama attention_bias)
  config.model.feed_forward_bias = False  # the feed-forward's biases even without use_bias (Llama's mlp_bias)
  config.model.parallel_residual = False  # x + Attention(LN1(x)) + FFN(LN2(x)) (GPT-NeoX); pre-LN, no cross-attention
  config.model.tie_embeddings = True   # output projection = input embedding transposed
  config.model.scale_embeddings = True  # multiply embeddings by sqrt(model_dim)
  config.model.bidirectional = True    # recurrent encoders read both directions
  config.model.layer_types = 'full'    # a cycle over the stack of full, sliding, chunked: 'sliding,full' alternates
  config.model.sliding_window = 0      # W: a sliding layer's query sees itself and the W - 1 keys before it
  config.model.attention_chunk_size = 0  # C: a chunked layer's query sees its own chunk of C positions (decoders)
  config.model.qk_norm = 'none'        # RMSNorm of queries and keys: 'head' (Qwen3, Gemma 3), 'projection' (OLMo 2)
  config.model.final_logit_softcap = 0.0  # c > 0: output logits c tanh(x / c) (Gemma 2)
  config.model.logit_scale = 1.0       # output logits times it, before any cap (Cohere)
  config.model.attention_softcap = 0.0  # c > 0: attention logits c tanh(x / c) (Gemma 2)
  config.model.attention_sinks = False  # a learned sink logit per head and layer in every softmax (GPT-OSS)
  config.model.query_scale = 0.0       # > 0: attention logits times its inverse square root (Gemma); 0: 1/sqrt(head)
  config.model.sandwich_norm = False   # a norm after each sublayer too, x + LN'(F(LN(x))) (Gemma 2, 3); pre-LN
  config.model.remat = 'none'          # recompute layer activations in the backward pass: 'block' (all) or 'matmuls'
  #                                      (all but the matmuls' outputs); less memory, more time
  config.model.compute_dtype = 'float32'  # or 'bfloat16' (parameters, softmax, norms and logits stay float32)
  config.model.attention_implementation = 'auto'  # auto, explicit, blockwise, xla, cudnn (transformer/attention_core.py)
  config.model.attention_block_size = 128  # causal attention 128 queries at a time, later keys skipped; 0: one softmax
  config.model.attention_key_block_size = 0  # with blocks: keys per online-softmax block; 0: all at once
  config.model.randomized_max_length = 0  # > 0: positions a sorted random subset of [0, this) (Ruoss et al. 2023),
  #                                        drawn per training step and fixed in evaluation; 0: 0 .. L-1
  config.model.pooling = 'cls'         # encoder-only: a learned [CLS] token ('cls'), the last valid position ('last') or the mean ('mean')

  config.model.position = ml_collections.ConfigDict()
  config.model.position.kind = 'sinusoidal'  # a variant of transformer.positions.VARIANTS (README's table)
  config.model.position.max_length = 256     # learned tables' rows (learned, tupe with a learned table)
  # Every other setting of a variant has its default in the variant's file (transformer/positions/) and is
  # set as --config.model.position.FIELD=VALUE; a run reads and records only its own variant's settings.
  config.model.local_position = ml_collections.ConfigDict()
  config.model.local_position.kind = ''  # the sliding and chunked layers' variant ('': model.position's), its
  #                                        settings as --config.model.local_position.FIELD=VALUE (Gemma 3's base)


def _add_train(config: ml_collections.ConfigDict) -> None:
  """config.train: the optimisation, its schedule and the run's records."""
  config.train = ml_collections.ConfigDict()
  config.train.steps = 2000            # optimisation steps
  config.train.batch_size = 64         # global batch, split over every device of every host
  config.train.gradient_accumulation = 1  # microbatches per step (batch_size stays the global batch): less memory
  config.train.eval_microbatches = 1   # microbatches per evaluation batch (the same sums): less memory at long lengths
  config.train.optimizer = 'adamw'     # 'adamw' or 'adam'
  config.train.learning_rate = 1e-3    # peak learning rate
  config.train.schedule = 'warmup_rsqrt'  # 'warmup_rsqrt' (the paper), 'warmup_cosine', 'constant'
  config.train.warmup_steps = 200      # linear warm-up steps
  config.train.beta1 = 0.9             # Adam beta1 (the paper)
  config.train.beta2 = 0.98            # Adam beta2 (the paper)
  config.train.epsilon = 1e-9          # Adam epsilon (the paper)
  config.train.weight_decay = 0.0      # AdamW decoupled weight decay
  config.train.gradient_clip = 1.0     # global-norm clipping; 0 disables
  config.train.label_smoothing = 0.0   # the paper uses 0.1
  config.train.log_every = 50          # steps between training-metric records
  config.train.eval_every = 500        # steps between evaluations (and one at the end)
  config.train.checkpoint_every = 500  # steps between checkpoints (and one at the end)
  config.train.keep_checkpoints = 2    # how many checkpoints to keep
  config.train.init_from = ''          # a finished run's workdir: start from its parameters (fine-tuning, e.g. at a
  #                                      longer length with a context extension); '': a fresh initialisation


def for_real_data(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The regularised recipe of the real-data tasks (forecast, classify, tracing): dropout 0.1,
  weight decay 0.01, a short warm-up and a cosine decay, a log line every 100 steps."""
  config.model.dropout_rate = 0.1            # small data sets overfit without it
  config.train.schedule = 'warmup_cosine'    # decays to zero by the last step
  config.train.warmup_steps = 100            # short: these runs are 1,000-2,000 steps
  config.train.weight_decay = 0.01           # decoupled (AdamW)
  config.train.log_every = 100               # a log line every 100 steps
  return config
