#include "ggml.h"
#include "ggml-cpu.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
int main(int argc, char**argv){
    ggml_type type = (ggml_type)atoi(argv[1]); int K=atoi(argv[2]), R=atoi(argv[3]), N=atoi(argv[4]); int th=atoi(argv[5]);
    ggml_init_params p={ (size_t)512<<20, nullptr, false}; ggml_context*ctx=ggml_init(p);
    std::mt19937 rng(1); std::normal_distribution<float> d(0,0.05f);
    std::vector<float> f((size_t)K*R); for(auto&x:f)x=d(rng);
    ggml_tensor*W=ggml_new_tensor_2d(ctx,type,K,R); ggml_quantize_chunk(type,f.data(),W->data,0,R,K,nullptr);
    ggml_tensor*X=ggml_new_tensor_2d(ctx,GGML_TYPE_F32,K,N); for(int i=0;i<K*N;i++)((float*)X->data)[i]=d(rng)*20;
    ggml_cgraph*gf=ggml_new_graph(ctx);
    ggml_tensor*Y=nullptr;
    for(int l=0;l<18;l++){ Y=ggml_mul_mat(ctx,W,X); ggml_build_forward_expand(gf,Y);}
    ggml_graph_compute_with_ctx(ctx,gf,th);
    auto t0=std::chrono::steady_clock::now(); int it=200;
    for(int i=0;i<it;i++) ggml_graph_compute_with_ctx(ctx,gf,th);
    double us=std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-t0).count()/it/18;
    printf("type %s K=%d R=%d N=%d: %.1f us per mul_mat\n", ggml_type_name(type),K,R,N,us);
}
