// The sanitizer driver: one kernel launch in a process built with ThreadSanitizer or AddressSanitizer.
//
//   driver MODULE.so REQUEST RESPONSE
//
// kernel_runner.py writes REQUEST: the kernel's name, the launch shape, every allocation the arguments point
// into (copied byte for byte) and the arguments (scalars as bytes, pointers as allocation + offset). The
// driver gives each allocation an exact-size buffer of its own (so AddressSanitizer's redzone starts right
// after its last byte), loads the sanitized module, runs the launch (runner_runtime.cpp) and writes RESPONSE:
// a status, a fault message, and the allocations' bytes after the launch. A sanitizer report goes to stderr
// and ends the process with the sanitizer's exit code.
//
// Request, little-endian: "LFEMU001", u32 name length, name, u32 grid[3], u32 block[3], u64 dynamic shared
// bytes, u32 allocation count, per allocation u64 size and its bytes, u32 argument count, per argument u32
// kind (0: u32 size and the bytes of a scalar; 1: u32 allocation and i64 offset of a pointer; 2: null).
// Response: u32 status (0 done, 1 fault), u32 message length, message, then each allocation's bytes.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "runner_abi.h"

extern "C" const lf_emu::Api* lf_emu_api();
extern "C" int lf_emu_launch(const lf_emu_launch_desc* d, char* error, size_t error_size);

namespace {

[[noreturn]] void die(const char* what, const char* detail = "") {
    fprintf(stderr, "layerforge emulated GPU driver: %s %s\n", what, detail);
    exit(3);
}

struct Reader {
    FILE* f;
    template <class T> T get() {
        T v;
        if (fread(&v, sizeof v, 1, f) != 1) die("truncated request");
        return v;
    }
    void bytes(void* out, size_t n) {
        if (n && fread(out, 1, n, f) != n) die("truncated request");
    }
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 4) die("usage: driver MODULE.so REQUEST RESPONSE");
    FILE* in = fopen(argv[2], "rb");
    if (!in) die("cannot open", argv[2]);
    Reader r{in};
    char magic[8];
    r.bytes(magic, 8);
    if (memcmp(magic, "LFEMU001", 8) != 0) die("not a request:", argv[2]);
    std::string name(r.get<uint32_t>(), '\0');
    r.bytes(&name[0], name.size());
    lf_emu_launch_desc d{};
    for (int i = 0; i < 3; ++i) d.grid[i] = r.get<uint32_t>();
    for (int i = 0; i < 3; ++i) d.block[i] = r.get<uint32_t>();
    d.dynamic_shared = r.get<uint64_t>();
    d.host_threads = 1;
    std::vector<char*> allocations(r.get<uint32_t>());
    std::vector<uint64_t> sizes(allocations.size());
    for (size_t i = 0; i < allocations.size(); ++i) {
        sizes[i] = r.get<uint64_t>();
        void* p = nullptr;
        if (posix_memalign(&p, 256, sizes[i] ? sizes[i] : 1) != 0) die("out of memory");
        allocations[i] = static_cast<char*>(p);
        r.bytes(allocations[i], sizes[i]);
    }
    uint32_t nargs = r.get<uint32_t>();
    std::vector<std::vector<char>> values(nargs);
    std::vector<void*> args(nargs);
    for (uint32_t i = 0; i < nargs; ++i) {
        uint32_t kind = r.get<uint32_t>();
        if (kind == 0) {
            values[i].resize(r.get<uint32_t>());
            r.bytes(values[i].data(), values[i].size());
        } else {
            char* pointer = nullptr;
            if (kind == 1) {
                uint32_t index = r.get<uint32_t>();
                int64_t offset = r.get<int64_t>();
                if (index >= allocations.size()) die("bad allocation index");
                pointer = allocations[index] + offset;
            }
            values[i].resize(sizeof pointer);
            memcpy(values[i].data(), &pointer, sizeof pointer);
        }
        args[i] = values[i].data();
    }
    fclose(in);

    void* module = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!module) die("cannot load the module:", dlerror());
    auto init = reinterpret_cast<void (*)(const lf_emu::Api*)>(dlsym(module, "lf_emu_module_init"));
    auto count = reinterpret_cast<unsigned (*)()>(dlsym(module, "lf_emu_kernel_count"));
    auto kernel = reinterpret_cast<const lf_emu::KernelInfo* (*)(unsigned)>(dlsym(module, "lf_emu_kernel"));
    if (!init || !count || !kernel) die("not a kernel module:", argv[1]);
    d.touch_shared = reinterpret_cast<void (*)()>(dlsym(module, "lf_emu_touch_shared"));
    init(lf_emu_api());
    for (unsigned i = 0; i < count(); ++i) {
        const lf_emu::KernelInfo* info = kernel(i);
        if (name == info->name) {
            if (info->nparams != nargs) die("wrong argument count for", info->name);
            d.run = info->run;
        }
    }
    if (!d.run) die("no such kernel:", name.c_str());
    d.name = name.c_str();
    d.args = args.data();

    char error[4096] = "";
    int status = lf_emu_launch(&d, error, sizeof error);

    FILE* out = fopen(argv[3], "wb");
    if (!out) die("cannot write", argv[3]);
    uint32_t header[2] = {uint32_t(status), uint32_t(strlen(error))};
    fwrite(header, sizeof header, 1, out);
    fwrite(error, 1, header[1], out);
    for (size_t i = 0; i < allocations.size(); ++i) fwrite(allocations[i], 1, sizes[i], out);
    fclose(out);
    // no destructors: after a fault the GPU threads never ended, and freeing what they read would be a race
    // to ThreadSanitizer
    fflush(nullptr);
    _exit(0);
}
