// The source of two_kernels.cubin (tests/runtime/test_resources.py): nvcc -arch=sm_90 -cubin -o two_kernels.cubin two_kernels.cu
// ptxas -v: add_kernel 10 registers, 0 bytes stack frame, 1200 bytes smem; big_kernel 128 registers, 256 bytes stack frame
extern "C" __global__ void __launch_bounds__(128) add_kernel(float* a, const float* b, int n){
  __shared__ float s[300];
  int i = blockIdx.x*blockDim.x+threadIdx.x;
  s[threadIdx.x]=b[i]; __syncthreads();
  if(i<n) a[i]+=s[(threadIdx.x+1)%128];
}
extern "C" __global__ void big_kernel(float* a, int n){
  float loc[64];
  for(int j=0;j<64;j++) loc[j]=a[j*n+threadIdx.x];
  float acc=0; for(int j=0;j<64;j++) acc+=loc[(j*7+threadIdx.x)%64]*loc[j];
  a[threadIdx.x]=acc;
}
