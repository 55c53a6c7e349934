/* Drives the compiled shim against a real TensorRT runtime library, the way the Rust side does:
 * dlopen the library, look up getInferLibVersion and createInferRuntime_INTERNAL, hand both to
 * itrt_runtime_create. Prints one line: "headers H library L build B created" or
 * "headers H library L build B refused: <error text>"; exits 0 when created, 3 when refused, 2 when the
 * library cannot be opened, 4 when an error text leaks from one call into the next. With
 * `--threads` instead, checks that an error logged on another thread during a call does not fail
 * it (exit 0, else 4). Used by
 * tests/tensorrt.rs (not shipped). */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

void* itrt_runtime_create(void* create_fn, void* version_fn, char* err, size_t cap);
int32_t itrt_header_version(void);
int32_t itrt_test_foreign_error_during_call(char* err, size_t cap);

int main(int argc, char** argv)
{
    if (argc == 2 && strcmp(argv[1], "--threads") == 0)
    {
        /* The shim compiled with ITRT_TEST_HOOKS: a call during which another thread logs an
         * error must not count it as its own. */
        char err[1024];
        int32_t r = itrt_test_foreign_error_during_call(err, sizeof err);
        if (r != 0)
        {
            printf("per-thread errors broken (%d): %s\n", r, err);
            return 4;
        }
        printf("per-thread errors ok: %s\n", err);
        return 0;
    }
    if (argc != 2)
    {
        fprintf(stderr, "usage: %s LIBRARY\n", argv[0]);
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
    {
        printf("cannot open %s: %s\n", argv[1], dlerror());
        return 2;
    }
    void* version = dlsym(lib, "getInferLibVersion");
    void* create = dlsym(lib, "createInferRuntime_INTERNAL");
    void* build = dlsym(lib, "getInferLibBuildVersion");
    int32_t lib_version = version != NULL ? ((int32_t(*)(void)) version)() : -1;
    int32_t lib_build = build != NULL ? ((int32_t(*)(void)) build)() : -1;
    char err[1024];
    /* A failing call first: its error text must not show up in the next call's. */
    if (itrt_runtime_create(NULL, NULL, err, sizeof err) != NULL || strstr(err, "is missing") == NULL)
    {
        printf("a call without entry points did not fail with its own error: %s\n", err);
        return 4;
    }
    void* rt = itrt_runtime_create(create, version, err, sizeof err);
    if (strstr(err, "is missing") != NULL)
    {
        printf("stale error text from the previous call: %s\n", err);
        return 4;
    }
    if (rt == NULL)
    {
        printf("headers %d library %d build %d refused: %s\n", itrt_header_version(), lib_version, lib_build, err);
        return 3;
    }
    printf("headers %d library %d build %d created\n", itrt_header_version(), lib_version, lib_build);
    return 0;
}
