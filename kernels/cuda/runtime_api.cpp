// Device selection, memory, streams and events for callers that do not link CUDA (the shard's
// NCCL communicator, the GPU tests and benchmarks): thin checked wrappers over the runtime.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

using tessera::cuda::record_message;

extern "C" int tessera_cuda_set_device(int device) {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return 0;
}

extern "C" int tessera_cuda_device_info(int device, char* h_name, int cap, int* major, int* minor) {
  cudaDeviceProp prop;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  if (h_name && cap > 0) std::snprintf(h_name, static_cast<size_t>(cap), "%s", prop.name);
  if (major) *major = prop.major;
  if (minor) *minor = prop.minor;
  return 0;
}

extern "C" int tessera_cuda_malloc(void** d_ptr, int64_t bytes) {
  if (!d_ptr || bytes < 0) return record_message("tessera_cuda_malloc: null out pointer or negative size");
  *d_ptr = nullptr;
  if (bytes == 0) return 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMalloc(d_ptr, static_cast<size_t>(bytes)));
  return 0;
}

extern "C" int tessera_cuda_free(void* d_ptr) {
  if (!d_ptr) return 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaFree(d_ptr));
  return 0;
}

extern "C" int tessera_cuda_memcpy(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) return record_message("tessera_cuda_memcpy: negative size");
  if (bytes == 0) return 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault));
  // cudaMemcpy from pageable memory may return before the DMA lands, and work on non-blocking
  // streams is not ordered after the legacy stream: wait, so the copy is complete for everyone.
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(0));
  return 0;
}

extern "C" int tessera_cuda_memcpy_async(void* dst, const void* src, int64_t bytes, void* stream) {
  if (bytes < 0) return record_message("tessera_cuda_memcpy_async: negative size");
  if (bytes == 0) return 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault,
                                               static_cast<cudaStream_t>(stream)));
  return 0;
}

extern "C" int tessera_cuda_memset(void* d_ptr, int value, int64_t bytes) {
  if (bytes < 0) return record_message("tessera_cuda_memset: negative size");
  if (bytes == 0) return 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemset(d_ptr, value, static_cast<size_t>(bytes)));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(0));  // complete, as tessera_cuda_memcpy
  return 0;
}

extern "C" int tessera_cuda_device_synchronize() {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return 0;
}

extern "C" int tessera_cuda_stream_create(void** stream) {
  if (!stream) return record_message("tessera_cuda_stream_create: null out pointer");
  cudaStream_t s = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return 0;
}

extern "C" int tessera_cuda_stream_destroy(void* stream) {
  if (!stream) return 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
  return 0;
}

extern "C" int tessera_cuda_stream_synchronize(void* stream) {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return 0;
}

extern "C" int tessera_cuda_event_create(void** event) {
  if (!event) return record_message("tessera_cuda_event_create: null out pointer");
  cudaEvent_t e = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  *event = e;
  return 0;
}

extern "C" int tessera_cuda_event_destroy(void* event) {
  if (!event) return 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
  return 0;
}

extern "C" int tessera_cuda_event_record(void* event, void* stream) {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
  return 0;
}

extern "C" int tessera_cuda_event_elapsed_ms(void* start, void* end, float* ms) {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return 0;
}

extern "C" int tessera_cuda_graph_begin_capture(void* stream) {
  if (!stream) return record_message("tessera_cuda_graph_begin_capture: the legacy stream cannot be captured");
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal));
  return 0;
}

extern "C" int tessera_cuda_graph_end_capture(void* stream, void** graph_exec) {
  if (!graph_exec) return record_message("tessera_cuda_graph_end_capture: null out pointer");
  *graph_exec = nullptr;
  cudaGraph_t graph = nullptr;
  // Ends capture mode even when the capture was invalidated (then graph is null).
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph));
  if (!graph) return record_message("tessera_cuda_graph_end_capture: the capture produced no graph");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TESSERA_CUDA_RETURN_IF_ERROR(e);
  *graph_exec = exec;
  return 0;
}

extern "C" int tessera_cuda_graph_launch(void* graph_exec, void* stream) {
  if (!graph_exec) return record_message("tessera_cuda_graph_launch: null graph");
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec), static_cast<cudaStream_t>(stream)));
  return 0;
}

extern "C" int tessera_cuda_graph_destroy(void* graph_exec) {
  if (!graph_exec) return 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec)));
  return 0;
}
