# Shared by the real-model bench scripts (sourced, not run): the runtime.toml tensor tables of
# the models tests/it/real_models.py fetches, and starting a server on a free port.

# The tensor tables, as runtime.toml writes them.
DET_TENSORS='[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 3, -1, -1]
profile = { min = [3, 32, 32], opt = [3, 96, 96], max = [3, 256, 256] }

[[outputs]]
name = "sigmoid_0.tmp_0"
datatype = "FP32"
dims = [-1, 1, -1, -1]'
CLS_TENSORS='[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 3, 48, 192]

[[outputs]]
name = "save_infer_model/scale_0.tmp_1"
datatype = "FP32"
dims = [-1, 2]'
REC_TENSORS='[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 3, 48, -1]
profile = { min = [3, 48, 32], opt = [3, 48, 160], max = [3, 48, 320] }

[[outputs]]
name = "softmax_11.tmp_0"
datatype = "FP32"
dims = [-1, -1, 6625]'
# tokens: one [-1, -1] INT64 input (the sequence dimension named, profile up to MAX) per name.
tokens() {
    local max=$1 name
    shift
    for name in "$@"; do
        printf '[[inputs]]\nname = "%s"\ndatatype = "INT64"\ndims = [-1, -1]\nprofile = { min = [1], opt = [32], max = [%s] }\ndim_names = ["sequence"]\n\n' "$name" "$max"
    done
}
WORDLLAMA_TENSORS="$(tokens 128 input_ids attention_mask)
[[outputs]]
name = \"embedding\"
datatype = \"FP32\"
dims = [-1, 256]"
MINILM_TENSORS="$(tokens 256 input_ids attention_mask token_type_ids)
[[outputs]]
name = \"last_hidden_state\"
datatype = \"FP32\"
dims = [-1, -1, 384]"

# start_server BIN CONFIG LOG: starts BIN on CONFIG (gRPC on a free port), waits until it is
# ready and sets $pid and $addr (the HTTP address); the caller kills $pid.
start_server() {
    local bin=$1 config=$2 log=$3
    INFER_GRPC_PORT=0 "$bin" --config "$config" > "$log" &
    pid=$!
    for _ in $(seq 600); do grep -q '"msg":"ready"' "$log" && break; sleep 0.5; done
    grep -q '"msg":"ready"' "$log" || { cat "$log" >&2; exit 1; }
    addr=$(sed -n 's/.*"addr":"\([^"]*\)".*"msg":"listening".*/\1/p' "$log" | head -1)
}
