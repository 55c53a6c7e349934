"""Run a GitHub Actions workflow's jobs on this machine, the way a runner would, so the CI example
(`examples/ci/build-images.yml`) cannot silently rot.

Every `run:` step runs as written (bash -eo pipefail, in the job's workspace, with GITHUB_OUTPUT,
GITHUB_PATH and GITHUB_ENV honoured); `${{ }}` expressions are evaluated by a small evaluator
that knows the contexts the example uses and refuses anything else, so a new expression in the
example fails here instead of on a user's runner. The `uses:` steps the example needs are
emulated: checkout (the user's repository, infer-build's own checkout, or TensorRT's headers from
`--tensorrt-headers`), cache (always a
miss), upload-artifact and download-artifact (through a local folder, with the executable bits
dropped as the real artifact store drops them). Jobs run in `needs` order; a matrix from an
expression fans out into one run per entry. What cannot run here is said, not hidden: a job
container (the TensorRT builder image) runs on the host with the fake GPU tools of
`--gpu-tools` first on PATH.

usage: ci_workflow.py WORKFLOW --user-repo DIR --infer-build-repo DIR --work DIR
                      [--gpu-tools DIR] [--tensorrt-headers DIR] [--set CONTEXT.NAME=VALUE ...]
Prints one JSON line per job run, and `ok` at the end.
"""

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import yaml


class WorkflowError(Exception):
    pass


# ---------------------------------------------------------------- expressions


TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_-]*)|(?P<op>[.(),]))")


def tokenize(text):
    pos, out = 0, []
    text = text.strip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise WorkflowError(f"expression `{text}`: cannot read from `{text[pos:]}`")
        pos = m.end()
        for kind in ("str", "num", "name", "op"):
            if m.group(kind) is not None:
                out.append((kind, m.group(kind)))
    return out


class Expr:
    """`name.name.name`, `'string'`, numbers and calls of the functions below, nothing else."""

    def __init__(self, contexts, workspace):
        self.contexts = contexts
        self.workspace = workspace

    def eval(self, text):
        self.toks, self.i = tokenize(text), 0
        v = self.value()
        if self.i != len(self.toks):
            raise WorkflowError(f"expression `{text}`: unexpected `{self.toks[self.i][1]}`")
        return v

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else (None, None)

    def take(self, want=None):
        tok = self.peek()
        if tok[0] is None or (want and tok[1] != want):
            raise WorkflowError(f"expected `{want}`, got `{tok[1]}`")
        self.i += 1
        return tok

    def value(self):
        kind, tok = self.take()
        if kind == "str":
            return tok[1:-1].replace("''", "'")
        if kind == "num":
            return int(tok)
        if kind != "name":
            raise WorkflowError(f"unexpected `{tok}`")
        if self.peek()[1] == "(":
            self.take("(")
            args = []
            while self.peek()[1] != ")":
                args.append(self.value())
                if self.peek()[1] == ",":
                    self.take(",")
            self.take(")")
            return self.call(tok, args)
        if tok not in self.contexts:
            raise WorkflowError(f"context `{tok}` is not known to this runner")
        v = self.contexts[tok]
        path = [tok]
        while self.peek()[1] == ".":
            self.take(".")
            _, key = self.take()
            path.append(key)
            if not isinstance(v, dict) or key not in v:
                raise WorkflowError(f"`{'.'.join(path)}` is not set")
            v = v[key]
        return v

    def call(self, name, args):
        if name == "fromJSON":
            return json.loads(args[0])
        if name == "toJSON":
            return json.dumps(args[0])
        if name == "hashFiles":
            h = hashlib.sha256()
            for root, dirs, files in os.walk(self.workspace):
                dirs.sort()
                for f in sorted(files):
                    rel = os.path.relpath(os.path.join(root, f), self.workspace)
                    if any(fnmatch.fnmatch(rel, p) for p in args):
                        with open(os.path.join(root, f), "rb") as fh:
                            h.update(hashlib.sha256(fh.read()).digest())
            return h.hexdigest()
        raise WorkflowError(f"function `{name}` is not known to this runner")


SUBST = re.compile(r"\$\{\{(.*?)\}\}", re.S)


def render(value, expr):
    """Evaluate expressions in a string (a whole-string expression keeps its type)."""
    if isinstance(value, str):
        whole = SUBST.fullmatch(value.strip())
        if whole:
            return expr.eval(whole.group(1))
        return SUBST.sub(lambda m: stringify(expr.eval(m.group(1))), value)
    if isinstance(value, list):
        return [render(v, expr) for v in value]
    if isinstance(value, dict):
        return {k: render(v, expr) for k, v in value.items()}
    return value


def stringify(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return "" if v is None else str(v)


# ---------------------------------------------------------------- runner files


def read_kv_file(path):
    """GITHUB_OUTPUT / GITHUB_ENV: `name=value` lines and `name<<DELIM` blocks."""
    out = {}
    if not os.path.exists(path):
        return out
    lines = open(path).read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line:
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            block = []
            while i < len(lines) and lines[i] != delim:
                block.append(lines[i])
                i += 1
            i += 1
            out[name] = "\n".join(block)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        else:
            raise WorkflowError(f"{path}: line `{line}` is neither name=value nor name<<DELIM")
    return out


def copy_into(src, dest, drop_exec=False):
    if os.path.isdir(src):
        for root, dirs, files in os.walk(src):
            rel = os.path.relpath(root, src)
            os.makedirs(os.path.join(dest, rel), exist_ok=True)
            for f in files:
                to = os.path.join(dest, rel, f)
                shutil.copyfile(os.path.join(root, f), to)
                if not drop_exec:
                    shutil.copymode(os.path.join(root, f), to)
                else:
                    os.chmod(to, 0o644)
    else:
        os.makedirs(dest, exist_ok=True)
        to = os.path.join(dest, os.path.basename(src))
        shutil.copyfile(src, to)
        os.chmod(to, 0o644 if drop_exec else stat.S_IMODE(os.stat(src).st_mode))


# ---------------------------------------------------------------- jobs


class Runner:
    def __init__(self, workflow, args):
        self.wf = workflow
        self.args = args
        self.artifacts = os.path.join(args.work, "artifacts")
        os.makedirs(self.artifacts, exist_ok=True)
        self.sets = {}
        for s in args.set:
            key, value = s.split("=", 1)
            ctx, name = key.split(".", 1)
            self.sets.setdefault(ctx, {})[name] = value
        self.needs = {}  # job id -> {"outputs": {...}, "result": ...}

    def order(self):
        jobs = self.wf["jobs"]
        done, out = set(), []
        while len(out) < len(jobs):
            ready = [j for j in jobs if j not in done and set(as_list(jobs[j].get("needs"))) <= done]
            if not ready:
                raise WorkflowError("the jobs' `needs` form a cycle or name a missing job")
            for j in ready:
                done.add(j)
                out.append(j)
        return out

    def base_contexts(self, job_id):
        job = self.wf["jobs"][job_id]
        return {
            "github": dict(self.sets.get("github", {})),
            "secrets": dict(self.sets.get("secrets", {})),
            "runner": {"os": "Linux", "arch": "X64", "temp": os.path.join(self.args.work, "tmp")},
            "needs": {j: self.needs[j] for j in as_list(job.get("needs"))},
            "env": {},
        }

    def run(self):
        for job_id in self.order():
            job = self.wf["jobs"][job_id]
            ctx = self.base_contexts(job_id)
            expr = Expr(ctx, self.args.user_repo)
            ctx["env"] = {k: stringify(render(v, expr)) for k, v in (self.wf.get("env") or {}).items()}
            # What a user sets for their own repository (RECIPE, REGISTRY) can be set here too.
            ctx["env"].update(self.sets.get("env", {}))
            strategy = job.get("strategy", {})
            matrix = render(strategy.get("matrix"), expr) if strategy else None
            entries = [None]
            if matrix is not None:
                extra = set(matrix) - {"include"}
                if extra:
                    raise WorkflowError(f"job {job_id}: matrix keys other than include ({sorted(extra)}) are not emulated")
                entries = matrix.get("include") or []
                if not entries:
                    raise WorkflowError(f"job {job_id}: the matrix has no entries")
            outputs = {}
            for n, entry in enumerate(entries):
                outputs = self.run_job(job_id, job, dict(ctx), entry, n)
            self.needs[job_id] = {"outputs": outputs, "result": "success"}

    def run_job(self, job_id, job, ctx, entry, n):
        name = job_id if entry is None else f"{job_id}[{n}]"
        ws = os.path.join(self.args.work, "jobs", name.replace("[", "-").replace("]", ""), "workspace")
        os.makedirs(ws)
        ctx["matrix"] = entry or {}
        ctx["steps"] = {}
        ctx["job"] = {}
        expr = Expr(ctx, ws)
        runs_on = render(job["runs-on"], expr)
        container = render(job.get("container"), expr)
        image = container.get("image") if isinstance(container, dict) else container
        env = dict(ctx["env"])
        env.update({k: stringify(render(v, expr)) for k, v in (job.get("env") or {}).items()})
        path_extra = []
        if image:
            if not self.args.gpu_tools:
                raise WorkflowError(f"job {name} runs in container {image}, and no --gpu-tools were given")
            path_extra.append(self.args.gpu_tools)
        report = {"job": name, "runs_on": runs_on, "container": image or "", "steps": []}
        runner_files = os.path.join(self.args.work, "jobs", name.replace("[", "-").replace("]", ""), "files")
        os.makedirs(runner_files)
        shell_default = ((self.wf.get("defaults") or {}).get("run") or {}).get("shell")
        for i, step in enumerate(job["steps"]):
            step_id = step.get("id", f"step{i}")
            if "if" in step:
                raise WorkflowError(f"job {name} step {step_id}: `if:` is not emulated")
            step_env = dict(env)
            step_env.update({k: stringify(render(v, expr)) for k, v in (step.get("env") or {}).items()})
            label = render(step.get("name", step.get("uses", step.get("run", "").split("\n")[0])), expr)
            if "run" in step:
                script = render(step["run"], expr)
                shell = step.get("shell", shell_default or "bash")
                if shell != "bash":
                    raise WorkflowError(f"job {name} step {step_id}: shell `{shell}` is not emulated")
                outputs = self.run_script(name, step_id, script, ws, step_env, path_extra, runner_files, env)
            elif "uses" in step:
                outputs = self.run_action(name, step["uses"], render(step.get("with") or {}, expr), ws)
            else:
                raise WorkflowError(f"job {name} step {step_id}: neither run nor uses")
            ctx["steps"][step_id] = {"outputs": outputs, "outcome": "success", "conclusion": "success"}
            report["steps"].append(label)
        print(json.dumps(report), flush=True)
        return {k: stringify(render(v, expr)) for k, v in (job.get("outputs") or {}).items()}

    def run_script(self, job, step_id, script, ws, env, path_extra, files, job_env):
        out_file = os.path.join(files, f"{step_id}.output")
        env_file = os.path.join(files, "env")
        path_file = os.path.join(files, "path")
        for f in (out_file, env_file, path_file):
            open(f, "a").close()
        extra_paths = [p for p in reversed(open(path_file).read().split("\n")) if p]
        full = dict(os.environ)
        full.update(env)
        full.update(read_kv_file(env_file))
        full.update({
            "GITHUB_OUTPUT": out_file, "GITHUB_ENV": env_file, "GITHUB_PATH": path_file,
            "GITHUB_WORKSPACE": ws, "CI": "true", "GITHUB_ACTIONS": "true",
            "RUNNER_TEMP": os.path.join(self.args.work, "tmp"),
        })
        os.makedirs(full["RUNNER_TEMP"], exist_ok=True)
        full["PATH"] = os.pathsep.join(extra_paths + path_extra + [os.environ["PATH"]])
        p = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                           cwd=ws, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        text = p.stdout.decode(errors="replace")
        if p.returncode != 0:
            raise WorkflowError(f"job {job} step {step_id} exited {p.returncode}:\n{script}\n--- output ---\n{text[-6000:]}")
        return read_kv_file(out_file)

    def run_action(self, job, uses, with_, ws):
        action = uses.split("@")[0]
        if action == "actions/checkout":
            repo = with_.get("repository")
            dest = os.path.join(ws, with_.get("path", "."))
            if repo is None:
                copy_into(self.args.user_repo, dest)
            elif repo == "infer-build/infer-build":
                # The infer-build checkout of this test run stands for the pinned release.
                os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
                os.symlink(os.path.abspath(self.args.infer_build_repo), dest)
            elif repo == "NVIDIA/TensorRT":
                # TensorRT's headers: the copy the test names (--tensorrt-headers), which is the
                # one scripts/test.sh built the GPU runtime against (build-runtime.sh resolves
                # the link, so the install finds that build and compiles nothing again).
                if not self.args.tensorrt_headers:
                    raise WorkflowError(f"job {job}: checkout of {repo} needs --tensorrt-headers")
                os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
                os.symlink(os.path.abspath(self.args.tensorrt_headers), dest)
            else:
                raise WorkflowError(f"job {job}: checkout of {repo} is not emulated")
            return {}
        if action == "actions/cache":
            for key in ("path", "key"):
                if not with_.get(key):
                    raise WorkflowError(f"job {job}: actions/cache without `{key}`")
            return {"cache-hit": "false"}
        if action == "actions/upload-artifact":
            name = with_.get("name", "artifact")
            dest = os.path.join(self.artifacts, name)
            if os.path.exists(dest):
                raise WorkflowError(f"job {job}: artifact {name} uploaded twice")
            found = False
            for p in [p for p in str(with_["path"]).split("\n") if p.strip()]:
                src = os.path.join(ws, p.strip())
                if os.path.exists(src):
                    found = True
                    if os.path.isdir(src) and p.strip().endswith("/"):
                        copy_into(src, dest)
                    elif os.path.isdir(src):
                        copy_into(src, os.path.join(dest, os.path.basename(os.path.normpath(p.strip()))))
                    else:
                        copy_into(src, dest)
            if not found and with_.get("if-no-files-found") == "error":
                raise WorkflowError(f"job {job}: artifact {name}: no files at {with_['path']}")
            return {}
        if action == "actions/download-artifact":
            dest = os.path.join(ws, with_.get("path", "."))
            if "name" in with_:
                names = [with_["name"]]
            else:
                names = sorted(n for n in os.listdir(self.artifacts) if fnmatch.fnmatch(n, with_.get("pattern", "*")))
            if not names:
                raise WorkflowError(f"job {job}: no artifact matches {with_}")
            for n in names:
                src = os.path.join(self.artifacts, n)
                if not os.path.isdir(src):
                    raise WorkflowError(f"job {job}: artifact {n} was never uploaded")
                to = dest if ("name" in with_ or with_.get("merge-multiple")) else os.path.join(dest, n)
                copy_into(src, to, drop_exec=True)
            return {}
        raise WorkflowError(f"job {job}: action {uses} is not emulated")


def as_list(v):
    if v is None:
        return []
    return v if isinstance(v, list) else [v]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workflow")
    ap.add_argument("--user-repo", required=True)
    ap.add_argument("--infer-build-repo", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--gpu-tools")
    ap.add_argument("--tensorrt-headers")
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    with open(args.workflow) as f:
        wf = yaml.safe_load(f)
    try:
        Runner(wf, args).run()
    except WorkflowError as e:
        print(f"workflow failed: {e}", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
