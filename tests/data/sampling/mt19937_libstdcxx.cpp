#include <random>
#include <cstdio>
#include <vector>
int main() {
    unsigned seeds[] = {0u, 42u, 4242u, 123456789u, 4294967294u};
    printf("{\n");
    for (int si = 0; si < 5; ++si) {
        unsigned s = seeds[si];
        std::mt19937 a(s), b(s), c(s);
        printf("\"%u\": {\"raw\": [", s);
        for (int i = 0; i < 8; ++i) printf("%s%u", i ? ", " : "", (unsigned)a());
        printf("], \"double\": [");
        std::uniform_real_distribution<double> d(0.0, 1.0);
        for (int i = 0; i < 8; ++i) printf("%s%.17g", i ? ", " : "", d(b));
        printf("], \"float\": [");
        std::uniform_real_distribution<float> f(0.0f, 1.0f);
        for (int i = 0; i < 8; ++i) printf("%s%.9g", i ? ", " : "", (double)f(c));
        printf("], \"discrete\": [");
        std::mt19937 e(s);
        std::vector<float> w = {0.1f, 0.2f, 0.3f, 0.4f, 0.0f, 1e-3f};
        for (int i = 0; i < 16; ++i) { std::discrete_distribution<int> dd(w.begin(), w.end()); printf("%s%d", i ? ", " : "", dd(e)); }
        printf("]}%s\n", si < 4 ? "," : "");
    }
    printf("}\n");
}
