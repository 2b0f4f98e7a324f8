// ipc_import_free.cu: does compute-sanitizer's leak check count a pool import that was released
// with cudaFree? The same steps as cuda-mem's gpu_ipc test, in plain CUDA runtime calls:
// the parent allocates 16 MiB from a pool shareable as a POSIX fd, exports pool and pointer, and
// re-executes itself; the child imports the pool and the pointer, writes, releases the import
// with cudaFree (as the runtime documentation says) and exits. (cuda-mem's child also destroys
// the imported pool when its MemPool drops; memcheck reports the same 16 MiB with and without
// that destroy, so it is left out here.) IMPORT_RELEASE=async releases the import with
// cudaFreeAsync on a stream and synchronizes instead, to see whether memcheck counts that path.
//
//   nvcc -arch=sm_90 -o ipc_import_free ipc_import_free.cu
//   compute-sanitizer --tool memcheck --leak-check full ./ipc_import_free
//   IMPORT_RELEASE=async compute-sanitizer --tool memcheck --leak-check full ./ipc_import_free
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call)                                                                           \
    do {                                                                                      \
        cudaError_t code_ = (call);                                                           \
        if (code_ != cudaSuccess) {                                                           \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,               \
                         cudaGetErrorString(code_));                                         \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

static const size_t BYTES = 16u << 20;

static int child(int fd, const char* hex) {
    cudaMemPool_t pool;
    CHECK(cudaMemPoolImportFromShareableHandle(&pool, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                               cudaMemHandleTypePosixFileDescriptor, 0));
    cudaMemPoolPtrExportData data;
    for (size_t i = 0; i < sizeof data.reserved; ++i) {
        unsigned byte = 0;
        std::sscanf(hex + 2 * i, "%2x", &byte);
        data.reserved[i] = static_cast<unsigned char>(byte);
    }
    void* ptr = nullptr;
    CHECK(cudaMemPoolImportPointer(&ptr, pool, &data));
    CHECK(cudaMemset(ptr, 7, BYTES));
    CHECK(cudaDeviceSynchronize());
    const char* release = std::getenv("IMPORT_RELEASE");
    if (release != nullptr && std::strcmp(release, "async") == 0) {
        cudaStream_t stream;
        CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        CHECK(cudaFreeAsync(ptr, stream));  // releases the import in stream order
        CHECK(cudaStreamSynchronize(stream));
        CHECK(cudaStreamDestroy(stream));
        std::printf("child: imported %zu bytes at %p, wrote them, cudaFreeAsync returned cudaSuccess\n", BYTES, ptr);
    } else {
        CHECK(cudaFree(ptr));  // releases the import
        std::printf("child: imported %zu bytes at %p, wrote them, cudaFree returned cudaSuccess\n", BYTES, ptr);
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 3) {
        return child(std::atoi(argv[1]), argv[2]);
    }
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    CHECK(cudaMemPoolCreate(&pool, &props));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void* ptr = nullptr;
    CHECK(cudaMallocFromPoolAsync(&ptr, BYTES, pool, stream));
    CHECK(cudaStreamSynchronize(stream));
    int fd = -1;
    CHECK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
    cudaMemPoolPtrExportData data;
    CHECK(cudaMemPoolExportPointer(&data, ptr));
    std::string hex;
    for (unsigned char byte : data.reserved) {
        char two[3];
        std::snprintf(two, sizeof two, "%02x", byte);
        hex += two;
    }
    fcntl(fd, F_SETFD, 0);  // keep the fd across exec
    pid_t pid = fork();
    if (pid == 0) {
        std::string fd_text = std::to_string(fd);
        execl("/proc/self/exe", argv[0], fd_text.c_str(), hex.c_str(), static_cast<char*>(nullptr));
        std::_Exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(cudaFreeAsync(ptr, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemPoolDestroy(pool));
    CHECK(cudaStreamDestroy(stream));
    close(fd);
    std::printf("parent: child exited with %d; freed the allocation and destroyed the pool\n",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
